package pipeline

import (
	"bufio"
	"bytes"
	"reflect"
	"testing"

	"tandem/hal"
)

// TestWireRoundTrip encodes each message and reads it back through readFrame.
func TestWireRoundTrip(t *testing.T) {
	var e encoder
	h := hello{Version: Version, Model: "m", Shape: "llama, 5 layers", Sizes: []int{3, 2}, Index: 1, BlockSize: 16, Blocks: 99, KVType: hal.F16}
	st := step{ID: 7, WantHidden: true, Pos: []int32{0, 1, 5}, SeqOf: []int32{0, 0, 1}, Blocks: [][]int32{{4}, {2, 9}},
		Outputs: []int{1, 2}, Hidden: []float32{1, -2, 3.5, 0, 1e-30, 7}}
	res := result{ID: 7, Logits: []float32{0.25, -1}, Hidden: []float32{}}
	var stream bytes.Buffer
	stream.Write(e.hello(&h))
	stream.Write(e.step(&st))
	stream.Write(e.result(&res))
	stream.Write(e.helloReply(&helloReply{Err: "no"}))
	r := bufio.NewReader(&stream)

	typ, p, _, err := readFrame(r, nil)
	if err != nil || typ != frameHello {
		t.Fatal(typ, err)
	}
	if got, err := decodeHello(p); err != nil || !reflect.DeepEqual(got, h) {
		t.Errorf("hello %+v %v, want %+v", got, err, h)
	}
	typ, p, _, err = readFrame(r, nil)
	var gs step
	if err != nil || typ != frameStep || decodeStep(p, &gs) != nil || !reflect.DeepEqual(gs, st) {
		t.Errorf("step %+v (%v), want %+v", gs, err, st)
	}
	typ, p, _, err = readFrame(r, nil)
	var gr result
	if err != nil || typ != frameResult || decodeResult(p, &gr) != nil || gr.ID != 7 || !reflect.DeepEqual(gr.Logits, res.Logits) || len(gr.Hidden) != 0 {
		t.Errorf("result %+v (%v), want %+v", gr, err, res)
	}
	typ, p, _, err = readFrame(r, nil)
	if hr, derr := decodeHelloReply(p); err != nil || typ != frameHelloReply || derr != nil || hr.Err != "no" {
		t.Errorf("hello reply %+v %v %v", hr, err, derr)
	}
	// KV operations and their results; a relayed frame reads back as it was.
	op := kvOp{ID: 9, Write: true, Format: "cpu-kv/1", Blocks: []int32{3, 1}, Data: []byte{1, 2, 3, 4}}
	kr := kvResult{ID: 9, Data: []byte{7, 8}}
	stream.Reset()
	stream.Write(e.kv(&op))
	var enc2 encoder
	stream.Write(enc2.kvResult(&kr, []byte{5, 6}))
	w := bufio.NewWriter(&stream)
	writeFrame(w, frameResult, e.result(&res)[5:])
	w.Flush()
	r = bufio.NewReader(&stream)
	typ, p, _, err = readFrame(r, nil)
	var gop kvOp
	if err != nil || typ != frameKV || decodeKV(p, &gop) != nil || !reflect.DeepEqual(gop, op) {
		t.Errorf("KV operation %+v (%v), want %+v", gop, err, op)
	}
	typ, p, _, err = readFrame(r, nil)
	var gkr kvResult
	if err != nil || typ != frameKVResult || decodeKVResult(p, &gkr) != nil || gkr.ID != 9 || !bytes.Equal(gkr.Data, []byte{5, 6, 7, 8}) {
		t.Errorf("KV result %+v (%v): want this stage's part in front", gkr, err)
	}
	typ, p, _, err = readFrame(r, nil)
	if err != nil || typ != frameResult || decodeResult(p, &gr) != nil || !reflect.DeepEqual(gr.Logits, res.Logits) {
		t.Errorf("relayed result %+v (%v)", gr, err)
	}
	// A frame longer than the limit is refused before anything is allocated for it.
	if _, _, _, err := readFrame(bufio.NewReader(bytes.NewReader([]byte{0xff, 0xff, 0xff, 0xff, 3})), nil); err == nil {
		t.Error("a 4 GiB frame was read")
	}
}

// FuzzDecode feeds arbitrary payloads to every decoder: an error, never a panic or a huge
// allocation.
func FuzzDecode(f *testing.F) {
	var e encoder
	f.Add(e.step(&step{ID: 1, Pos: []int32{0}, SeqOf: []int32{0}, Blocks: [][]int32{{0}}, Outputs: []int{0}, Hidden: []float32{1}})[5:])
	f.Add(e.hello(&hello{Version: 1, Model: "m", Sizes: []int{1, 1}})[5:])
	f.Add(e.result(&result{ID: 1, Logits: []float32{1}})[5:])
	f.Add(e.kv(&kvOp{ID: 1, Format: "cpu-kv/1", Blocks: []int32{2}, Data: []byte{1}})[5:])
	f.Add(e.kvResult(&kvResult{ID: 1, Err: "x", Data: []byte{1}}, nil)[5:])
	f.Add([]byte{0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, p []byte) {
		decodeHello(p)
		decodeHelloReply(p)
		var st step
		if decodeStep(p, &st) == nil {
			checkStep(&st, hal.KVLayout{Blocks: 4, BlockSize: 4}, 1)
		}
		var r result
		decodeResult(p, &r)
		var op kvOp
		decodeKV(p, &op)
		var kr kvResult
		decodeKVResult(p, &kr)
	})
}
