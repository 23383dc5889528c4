package cpu

import (
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"tandem/hal"
)

// portTestWeights returns a weight of every type with a packed form on this
// CPU, of 37 rows (two full groups and a partial one).
func portTestWeights(r *rand.Rand) []*hal.Weight {
	var ws []*hal.Weight
	for _, typ := range dotTestWeightTypes {
		if packFormatFor(kern.isa, typ) == nil {
			continue
		}
		k := 64
		if typ.BlockSize() == 256 {
			k = 512
		}
		var data []byte
		for range 37 {
			data = append(data, testQuantize(typ, testRandRow(r, k))...)
		}
		ws = append(ws, &hal.Weight{Name: typ.String(), Type: typ, Rows: 37, Cols: k, Data: data})
	}
	return ws
}

// TestImportWeightsRoundTrip: the prepared forms one backend exports, copied
// into another's memory and imported there, give every matmul output the
// bits of the first, and the second packs nothing.
func TestImportWeightsRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	ws := portTestWeights(r)
	if len(ws) == 0 {
		t.Skipf("no packed layouts under ISA %s on this CPU: nothing to export", kern.isa)
	}
	a, b := New(2), New(2)
	defer a.Close()
	defer b.Close()
	total := 0
	var exported []hal.Prepared
	for _, w := range ws {
		p, ok := a.ExportWeight(w)
		format, size, ok2 := b.PreparedFormat(w)
		if !ok || !ok2 || p.Format != format || len(p.Data) != size {
			t.Fatalf("%s: exported %q (%d bytes, %v), PreparedFormat %q (%d bytes, %v)", w.Name, p.Format, len(p.Data), ok, format, size, ok2)
		}
		if !strings.HasPrefix(p.Format, "cpu-pack/") {
			t.Errorf("%s: format %q", w.Name, p.Format)
		}
		exported = append(exported, p)
		total += (size + prepAlign - 1) &^ (prepAlign - 1)
	}
	// b's weights are copies of a's: the same bytes at other addresses.
	bws := make([]*hal.Weight, len(ws))
	for i, w := range ws {
		c := *w
		c.Data = append([]byte(nil), w.Data...)
		bws[i] = &c
	}
	mem, release := b.AllocPrepared(total)
	ps := make([]hal.Prepared, len(ws))
	off := 0
	for i, p := range exported {
		n := copy(mem[off:], p.Data)
		ps[i] = hal.Prepared{Format: p.Format, Data: mem[off : off+n : off+n]}
		off += (n + prepAlign - 1) &^ (prepAlign - 1)
	}
	if err := b.ImportWeights(bws, ps, release); err != nil {
		t.Fatal(err)
	}
	for i, w := range ws {
		x := make([]float32, 5*w.Cols)
		for j := range x {
			x[j] = float32(r.NormFloat64())
		}
		want, got := make([]float32, 5*w.Rows), make([]float32, 5*w.Rows)
		a.MatMul(hal.HostBuf(want), hal.HostBuf(x), 5, w)
		b.MatMul(hal.HostBuf(got), hal.HostBuf(x), 5, bws[i])
		for j := range want {
			if math.Float32bits(want[j]) != math.Float32bits(got[j]) {
				t.Fatalf("%s: output %d: imported %g, packed %g", w.Name, j, got[j], want[j])
			}
		}
	}
	if packed, imported := b.PreparedCounts(); packed != 0 || imported != len(ws) {
		t.Errorf("importing backend: %d packed, %d imported, want 0 and %d", packed, imported, len(ws))
	}
	if packed, imported := a.PreparedCounts(); packed != len(ws) || imported != 0 {
		t.Errorf("exporting backend: %d packed, %d imported, want %d packed", packed, imported, len(ws))
	}
}

// TestImportWeightsAllOrNone: a form of another format or size, or one that
// is misaligned, is refused with an error naming the weight, and then none
// of the batch is imported: the weights are packed at their first use.
func TestImportWeightsAllOrNone(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	ws := portTestWeights(r)
	if len(ws) < 2 {
		t.Skipf("fewer than two packed layouts under ISA %s on this CPU", kern.isa)
	}
	a := New(1)
	defer a.Close()
	good0, _ := a.ExportWeight(ws[0])
	good1, _ := a.ExportWeight(ws[1])
	// at returns p's bytes copied to an address off bytes past a cache line.
	at := func(p hal.Prepared, off int) hal.Prepared {
		buf := make([]byte, len(p.Data)+2*prepAlign)
		off += prepAlign - int(uintptrOf(buf)%prepAlign)
		return hal.Prepared{Format: p.Format, Data: append(buf[off:off:off+len(p.Data)], p.Data...)}
	}
	for _, tc := range []struct {
		name string
		bad  hal.Prepared
		want string
	}{
		{"format", hal.Prepared{Format: "cpu-pack/other/9", Data: at(good1, 0).Data}, "this CPU packs it as"},
		{"size", hal.Prepared{Format: good1.Format, Data: at(good1, 0).Data[:len(good1.Data)-1]}, "bytes"},
		{"alignment", at(good1, 1), "aligned"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := New(1)
			released := false
			err := b.ImportWeights(ws[:2], []hal.Prepared{at(good0, 0), tc.bad}, func() { released = true })
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), ws[1].Name) {
				t.Fatalf("ImportWeights: %v, want an error naming %s and saying %q", err, ws[1].Name, tc.want)
			}
			if _, imported := b.PreparedCounts(); imported != 0 {
				t.Fatalf("%d imported after a refused import", imported)
			}
			b.PrepareWeight(ws[0])
			if packed, _ := b.PreparedCounts(); packed != 1 {
				t.Errorf("%d packed: the refused batch's first weight should be packed at its first use", packed)
			}
			b.Close()
			if released {
				t.Error("a refused import's memory was released by the backend: it is still the caller's")
			}
		})
	}
}
