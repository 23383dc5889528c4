package cpu

import (
	"fmt"
	"hash/crc32"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"tandem/hal"
)

// pinnedLayouts holds a checksum of the bytes every packed layout makes of
// the same weights (pinnedLayoutWeight). Prepared forms travel between
// processes and builds under their format id (a pack cache, a peer), so a
// layout whose bytes change must change its id: raise layoutVersion (or give
// the layout a new name) and then this table.
var pinnedLayouts = map[string]uint32{
	"cpu-pack/bf16/1":      0x4e4d2544,
	"cpu-pack/f16/1":       0xae73d457,
	"cpu-pack/f32/1":       0x56c2154f,
	"cpu-pack/q2_k/1":      0x3ab634fb,
	"cpu-pack/q3_k/1":      0x2be06915,
	"cpu-pack/q4_0/1":      0x17c0f2ea,
	"cpu-pack/q4_1/1":      0x47ec7843,
	"cpu-pack/q4_k/1":      0x66748246,
	"cpu-pack/q5_0/1":      0xd4f3bdd1,
	"cpu-pack/q5_1/1":      0xcf9e2a16,
	"cpu-pack/q5_k/1":      0xa4f7ace5,
	"cpu-pack/q6_k.avx2/1": 0x5ba127cc,
	"cpu-pack/q6_k.vnni/1": 0x1806c972,
	"cpu-pack/q8_0.avx2/1": 0x4fc0e29b,
	"cpu-pack/q8_0.vnni/1": 0x801813eb,
}

// pinnedLayoutWeight is a weight of type t whose bytes depend on t alone:
// 37 rows (two full groups and a partial one) of two blocks or super-blocks.
func pinnedLayoutWeight(t hal.DType) *hal.Weight {
	r := rand.New(rand.NewPCG(uint64(t), 2026))
	k := 64
	if t.BlockSize() == 256 {
		k = 512
	}
	// Random bytes, not quantized values: packing moves bytes about, and
	// quantizing floats could round otherwise under another GOAMD64.
	rb, _ := t.RowBytes(k)
	data := make([]byte, 37*rb)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	return &hal.Weight{Type: t, Rows: 37, Cols: k, Data: data}
}

// TestPackLayoutsPinned packs the same weights in every layout of every ISA
// (the pack functions are Go: this runs on any amd64 CPU) and holds the
// bytes to pinnedLayouts; it also checks that formats sharing a layout name
// write the same bytes, which is what lets an AVX2 engine and an AVX-512 one
// exchange F16 weights.
func TestPackLayoutsPinned(t *testing.T) {
	workers := newPool(1)
	defer workers.close()
	got := map[string]uint32{}
	for _, isa := range []string{"avx512vnni", "avx2"} {
		for _, typ := range dotTestWeightTypes {
			forms := []*packFormat{packFormatFor(isa, typ)}
			if isa == "avx512vnni" && typ == hal.BF16 {
				forms = []*packFormat{packFormatBF16, packFormatBF16AVX2}
			}
			for _, f := range forms {
				if f == nil {
					continue
				}
				var arena packArena
				p := packWeight(f, pinnedLayoutWeight(typ), arena.alloc, workers)
				sum := crc32.Checksum(p.data, crc32.MakeTable(crc32.Castagnoli))
				arena.release()
				id := f.formatID()
				if prev, ok := got[id]; ok && prev != sum {
					t.Errorf("%s: two formats of this id write different bytes (%s under %s)", id, typ, isa)
				}
				got[id] = sum
			}
		}
	}
	if !maps.Equal(got, pinnedLayouts) {
		var b strings.Builder
		for _, id := range slices.Sorted(maps.Keys(got)) {
			fmt.Fprintf(&b, "\t%q: %#08x,\n", id, got[id])
		}
		t.Errorf("the packed layouts' bytes are not the pinned ones; if a pack function changed on purpose, raise the version of its layout and pin the new bytes:\n%s", b.String())
	}
}
