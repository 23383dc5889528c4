package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"maps"
	"slices"
	"testing"
)

func seedFiles(t testing.TB) [][]byte {
	seeds := [][]byte{validFile(t), raw("{}      ", 0), raw(`{"__metadata__":{"a":"b"}}`, 0)}
	w := NewWriter()
	w.Add("s", "F4", []int64{2}, []byte{0x12})
	w.Add("z", "BF16", []int64{0, 3}, nil)
	w.Add("scalar", "F64", []int64{}, make([]byte, 8))
	b, _ := w.Bytes()
	return append(seeds, b)
}

// checkTensors verifies ParseHeader's promises about a successful result.
func checkTensors(t *testing.T, ts []TensorInfo, dataLen int64) {
	var pos int64
	names := map[string]bool{}
	for _, ti := range ts {
		if ti.Begin != pos || ti.End < ti.Begin {
			t.Fatalf("%q: [%d, %d] after %d", ti.Name, ti.Begin, ti.End, pos)
		}
		pos = ti.End
		if names[ti.Name] {
			t.Fatalf("duplicate %q", ti.Name)
		}
		names[ti.Name] = true
		nbits, ok := DTypeBits(ti.DType)
		if !ok {
			t.Fatalf("%q: dtype %q", ti.Name, ti.DType)
		}
		if ti.Shape == nil {
			t.Fatalf("%q: nil shape", ti.Name)
		}
		if n := ti.NumElements(); n < 0 || n*int64(nbits) != (ti.End-ti.Begin)*8 {
			t.Fatalf("%q: %d elements of %d bits in %d bytes", ti.Name, n, nbits, ti.End-ti.Begin)
		}
		if ti.Supported() != ti.Type.Known() {
			t.Fatalf("%q: Supported %v but Type %v", ti.Name, ti.Supported(), ti.Type)
		}
	}
	if pos != dataLen {
		t.Fatalf("cover %d of %d", pos, dataLen)
	}
}

func FuzzParseHeader(f *testing.F) {
	for _, s := range seedFiles(f) {
		n := binary.LittleEndian.Uint64(s)
		f.Add(s[8:8+n], int64(uint64(len(s))-8-n))
	}
	f.Add([]byte(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}`), int64(6))
	f.Add([]byte(`{"a":{"dtype":"F32","shape":[-1,-4],"data_offsets":[0,16]}}`), int64(16))
	f.Fuzz(func(t *testing.T, header []byte, dataLen int64) {
		ts, _, err := ParseHeader(header, dataLen)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error does not wrap ErrFormat: %v", err)
			}
			return
		}
		checkTensors(t, ts, dataLen)
	})
}

func FuzzParse(f *testing.F) {
	for _, s := range seedFiles(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error does not wrap ErrFormat: %v", err)
			}
			return
		}
		n := binary.LittleEndian.Uint64(data)
		checkTensors(t, file.Tensors, int64(uint64(len(data))-8-n))
		// Writing the parsed file back gives the same tensors and bytes.
		w := NewWriter()
		for k, v := range file.Metadata {
			w.SetMetadata(k, v)
		}
		for i := range file.Tensors {
			ti := &file.Tensors[i]
			d := file.TensorData(ti)
			if int64(len(d)) != ti.End-ti.Begin {
				t.Fatalf("%q: %d bytes", ti.Name, len(d))
			}
			if err := w.Add(ti.Name, ti.DType, ti.Shape, d); err != nil {
				t.Fatalf("rewrite: %v", err)
			}
		}
		out, err := w.Bytes()
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("reparse: %v", err)
		}
		if len(again.Tensors) != len(file.Tensors) || !maps.Equal(again.Metadata, file.Metadata) && len(file.Metadata)+len(again.Metadata) > 0 {
			t.Fatalf("reparse: %d tensors, metadata %v vs %v", len(again.Tensors), again.Metadata, file.Metadata)
		}
		for i := range file.Tensors {
			a, b := &file.Tensors[i], &again.Tensors[i]
			if a.Name != b.Name || a.DType != b.DType || a.Begin != b.Begin || a.End != b.End || !slices.Equal(a.Shape, b.Shape) ||
				!bytes.Equal(file.TensorData(a), again.TensorData(b)) {
				t.Fatalf("reparse: %+v vs %+v", a, b)
			}
		}
	})
}
