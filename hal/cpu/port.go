package cpu

import (
	"fmt"
	"sync"
	"unsafe"

	"tandem/hal"
)

// The packed copies as prepared forms (hal.WeightPorter): a pack cache maps
// them from a file at the next start, a new engine receives them from a
// running one, and neither packs again.

var _ hal.WeightPorter = (*Backend)(nil)

// formatID is the prepared form's format name of packed weights of layout
// f.layout. The trailing version belongs to the layout: a change to what a
// pack function writes must raise it (TestPackLayoutsPinned holds every
// layout's bytes to a checksum, so that such a change cannot go unseen).
func (f *packFormat) formatID() string {
	return "cpu-pack/" + f.layout + "/" + layoutVersion
}

// layoutVersion is the version of every packed layout so far.
const layoutVersion = "1"

// PreparedKey names the backend and the instruction set its packed layouts
// were chosen for: "cpu avx512vnni+bf16", "cpu avx2", "cpu go".
func (b *Backend) PreparedKey() string { return "cpu " + kernelFeatures() }

// PreparedFormat returns the format and size of w's packed copy on this CPU,
// without packing.
func (b *Backend) PreparedFormat(w *hal.Weight) (format string, size int, ok bool) {
	f := packFormatFor(kern.isa, w.Type)
	if f == nil || len(w.Data) == 0 || w.Cols%f.blockElems != 0 {
		return "", 0, false
	}
	return f.formatID(), packedBytes(f, w), true
}

// packedBytes is the size of w's copy in layout f, as packWeight allocates it.
func packedBytes(f *packFormat, w *hal.Weight) int {
	groups := (w.Rows + packRows - 1) / packRows
	return groups * f.groupBlockBytes * (w.Cols / f.blockElems)
}

// ExportWeight returns w's packed copy, packing it first if need be.
func (b *Backend) ExportWeight(w *hal.Weight) (hal.Prepared, bool) {
	p := b.packs.packed(w, b.pool)
	if p == nil {
		return hal.Prepared{}, false
	}
	return hal.Prepared{Format: p.f.formatID(), Data: p.data}, true
}

// AllocPrepared maps n bytes outside the Go heap, aligned to huge pages,
// as the packed copies' own slabs are.
func (b *Backend) AllocPrepared(n int) ([]byte, func()) {
	mem, free := mapAligned(n, hugePageBytes)
	var once sync.Once
	return mem, func() { once.Do(free) }
}

// prepAlign is the alignment ImportWeights asks of a packed copy: a cache
// line, as the arena's pieces have.
const prepAlign = 64

// ImportWeights makes each ps[i] the packed copy of ws[i]. The kernels read
// the bytes in place until Close, which calls release.
func (b *Backend) ImportWeights(ws []*hal.Weight, ps []hal.Prepared, release func()) error {
	if len(ws) != len(ps) {
		return fmt.Errorf("cpu: %d weights and %d prepared forms", len(ws), len(ps))
	}
	fs := make([]*packFormat, len(ws))
	for i, w := range ws {
		format, size, ok := b.PreparedFormat(w)
		switch {
		case !ok:
			return fmt.Errorf("cpu: weight %s (%v) has no packed form on this CPU (%s)", w.Name, w.Type, kern.isa)
		case ps[i].Format != format:
			return fmt.Errorf("cpu: weight %s: prepared form %q, this CPU packs it as %q", w.Name, ps[i].Format, format)
		case len(ps[i].Data) != size:
			return fmt.Errorf("cpu: weight %s: prepared form of %d bytes, its packed copy has %d", w.Name, len(ps[i].Data), size)
		case uintptr(unsafe.Pointer(unsafe.SliceData(ps[i].Data)))%prepAlign != 0:
			return fmt.Errorf("cpu: weight %s: prepared form not aligned to %d bytes", w.Name, prepAlign)
		}
		fs[i] = packFormatFor(kern.isa, w.Type)
	}
	c := &b.packs
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[*hal.Weight]*packedWeight)
	}
	for i, w := range ws {
		if old, ok := c.m[w]; ok {
			old.free()
		}
		f := fs[i]
		c.m[w] = &packedWeight{
			f: f, groups: (w.Rows + packRows - 1) / packRows, nb: w.Cols / f.blockElems,
			data: ps[i].Data, free: func() {},
			src: packSource{data: unsafe.SliceData(w.Data), n: len(w.Data), typ: w.Type, rows: w.Rows, cols: w.Cols},
			// The file's pages were never read for the matmuls; rows that
			// Embed reads from a tied embedding are dropped again.
			released: newSourceReleaser(w.Data).ok,
		}
	}
	c.imported += len(ws)
	if release != nil {
		c.imports = append(c.imports, release)
	}
	return nil
}

// PreparedCounts returns how many weights this backend packed itself and how
// many it was given packed (ImportWeights): a start from a pack cache or a
// peer packs none.
func (b *Backend) PreparedCounts() (packed, imported int) {
	b.packs.mu.Lock()
	defer b.packs.mu.Unlock()
	return b.packs.packs, b.packs.imported
}
