package orpc

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"
)

func frameSeeds() [][]byte {
	var req Encoder
	(&request{method: "worker.Generate", timeout: 3 * time.Second, md: Metadata{"trace": "t1"}}).encode(&req)
	var end Encoder
	encodeEnd(&end, &Status{Code: NotFound, Message: "no such model"})
	var cancel Encoder
	encodeCancel(&cancel, &Status{Code: Canceled, Message: "bye"})
	h := hello{version: Version, agent: "tandem"}
	var all []byte
	all = appendFrame(all, frameHello, h.encode())
	all = appendFrame(all, frameRequest, req.Bytes())
	all = appendFrame(all, frameMessage, []byte("payload"))
	all = appendFrame(all, frameCancel, cancel.Bytes())
	all = appendFrame(all, frameEnd, end.Bytes())
	return [][]byte{
		nil,
		all,
		all[:len(all)-3],
		appendFrame(nil, 0x7f, []byte("x")),
		appendFrameHeader(nil, frameMessage, 1<<30),
		appendFrame(nil, frameRequest, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}),
		appendFrame(nil, frameEnd, []byte{0x80}),
	}
}

// FuzzFrameDecoder feeds arbitrary bytes to the frame reader and the control-frame decoders:
// they must return frames or errors, never panic, and never allocate past the limits.
func FuzzFrameDecoder(f *testing.F) {
	for _, s := range frameSeeds() {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		var hdr [frameHeaderLen]byte
		const maxMsg = 1 << 16
		for range 1000 {
			fr, err := readFrame(r, &hdr, maxMsg)
			if err != nil {
				if err != io.EOF && !isFrameError(err) {
					t.Fatalf("unexpected error type %T: %v", err, err)
				}
				return
			}
			if fr.typ == frameMessage && len(fr.payload) > maxMsg || fr.typ != frameMessage && len(fr.payload) > maxHeaderFrame {
				t.Fatalf("frame of %d bytes past the limit", len(fr.payload))
			}
			switch fr.typ {
			case frameHello:
				if h, err := decodeHello(fr.payload); err == nil {
					back, err := decodeHello(h.encode())
					if err != nil || back != h {
						t.Fatalf("HELLO round trip: %+v %+v %v", h, back, err)
					}
				}
			case frameRequest:
				if rq, err := decodeRequest(fr.payload); err == nil {
					var e Encoder
					rq.encode(&e)
					back, err := decodeRequest(e.Bytes())
					if err != nil || back.method != rq.method || back.timeout != rq.timeout || len(back.md) != len(rq.md) {
						t.Fatalf("REQUEST round trip: %+v %+v %v", rq, back, err)
					}
				}
			case frameEnd:
				if st, err := decodeEnd(fr.payload); err == nil {
					var e Encoder
					encodeEnd(&e, st)
					back, err := decodeEnd(e.Bytes())
					if err != nil || *back != *st {
						t.Fatalf("END round trip: %v %v %v", st, back, err)
					}
				}
			case frameCancel:
				decodeCancel(fr.payload)
			}
		}
	})
}

// FuzzDecoder runs a message decoder over arbitrary bytes: no panics, sticky errors, and any
// message it accepts re-encodes to something it decodes to the same value.
func FuzzDecoder(f *testing.F) {
	m := &testMsg{N: -5, U: 99, S: "s", B: []byte{1}, Toks: []int32{1, -1, 1 << 30}, H: []uint64{3}, F: []float32{0.5}, X: 1, OK: true}
	f.Add(Marshal(m))
	f.Add([]byte{})
	f.Add([]byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80})
	f.Add([]byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		var m testMsg
		err := Unmarshal(data, &m)
		if err != nil {
			if !errors.Is(err, ErrShortBuffer) && !errors.Is(err, ErrOverflow) {
				t.Fatalf("unexpected error %v", err)
			}
		} else {
			var back testMsg
			if err := Unmarshal(Marshal(&m), &back); err != nil {
				t.Fatalf("re-decode: %v", err)
			}
			if !bytes.Equal(Marshal(&m), Marshal(&back)) {
				t.Fatal("round trip changed the message")
			}
		}
		// Every getter on arbitrary input.
		d := NewDecoder(data)
		for d.Len() > 0 {
			switch d.Uint8() % 16 {
			case 0:
				d.Uvarint()
			case 1:
				d.Varint()
			case 2:
				d.Uint32()
			case 3:
				d.Uint64()
			case 4:
				d.Float32()
			case 5:
				d.BytesField()
			case 6:
				_ = d.String()
			case 7:
				d.Strings()
			case 8:
				d.Int32s()
			case 9:
				d.Uint32s()
			case 10:
				d.Int64s()
			case 11:
				d.FixedUint64s()
			case 12:
				d.Float32s()
			case 13:
				var sub testMsg
				d.Message(&sub)
			case 14:
				d.Bool()
			case 15:
				d.Float64()
			}
		}
		if d.Err() != nil && d.Len() != 0 {
			t.Fatal("Len after error")
		}
	})
}

func TestCodecRoundTrip(t *testing.T) {
	in := &testMsg{N: -1 << 62, U: 1<<64 - 1, S: "ünïcode", B: []byte{}, Toks: []int32{-1 << 31, 1<<31 - 1, 0}, H: []uint64{0, 1<<64 - 1}, F: []float32{-0.0, 3.5}, X: -2.5, OK: true}
	var e Encoder
	e.Message(in)
	e.Strings([]string{"a", "", "c"})
	e.Uint32s([]uint32{1<<32 - 1})
	e.Int64s([]int64{-1 << 63})
	d := NewDecoder(e.Bytes())
	var out testMsg
	d.Message(&out)
	ss := d.Strings()
	u32 := d.Uint32s()
	i64 := d.Int64s()
	if d.Err() != nil || d.Len() != 0 {
		t.Fatal(d.Err(), d.Len())
	}
	if !bytes.Equal(Marshal(in), Marshal(&out)) || len(ss) != 3 || ss[0] != "a" || u32[0] != 1<<32-1 || i64[0] != -1<<63 {
		t.Fatalf("%+v %v %v %v", out, ss, u32, i64)
	}
	// A count larger than the input is refused without allocating.
	var big Encoder
	big.Uvarint(1 << 40)
	if v := NewDecoder(big.Bytes()).FixedUint64s(); v != nil {
		t.Fatal("huge count accepted")
	}
	// Truncation anywhere is an error, never a panic.
	full := Marshal(in)
	for i := range full {
		if err := Unmarshal(full[:i], new(testMsg)); err == nil {
			t.Fatalf("truncated at %d decoded", i)
		}
	}
	var raw Bytes
	if err := Unmarshal(Marshal(Bytes("raw")), &raw); err != nil || string(raw) != "raw" {
		t.Fatal(raw, err)
	}
}
