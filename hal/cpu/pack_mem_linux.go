//go:build linux

package cpu

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"syscall"
	"unsafe"
)

// mapAligned returns n zeroed bytes mapped outside the Go heap, starting on
// a multiple of align, with transparent huge pages requested, and the
// function that unmaps them.
func mapAligned(n, align int) ([]byte, func()) {
	b, err := syscall.Mmap(-1, 0, n+align, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return make([]byte, n), func() {}
	}
	head := (align - int(uintptrOf(b)%uintptr(align))) % align
	end := head + (n+4095)&^4095
	if head > 0 {
		_ = syscall.Munmap(b[:head])
	}
	if end < len(b) {
		_ = syscall.Munmap(b[end:])
	}
	b = b[head:end:end]
	_ = syscall.Madvise(b, 14) // MADV_HUGEPAGE; advice only
	return b[:n:n], func() { _ = syscall.Munmap(b) }
}

const (
	madvRandom   = 1
	madvDontNeed = 4
	page         = 4096
)

// pagesAround returns the bytes from the start of the page holding lo to
// the end of the page holding hi−1, of the allocation that holds src (the
// bytes outside src are only advised about, never read or written).
func pagesAround(src []byte, lo, hi int) []byte {
	p := uintptrOf(src)
	a := int((p+uintptr(lo))&^(page-1)) - int(p)
	b := int((p+uintptr(hi)+page-1)&^(page-1)) - int(p)
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(src)), a)), b-a)
}

// sourceReleaser drops a weight's original bytes from the process's page
// tables (MADV_DONTNEED) as packing consumes them, so that neither the
// packing of a large weight (an embedding of a few hundred MiB) nor the
// packed weights afterwards keep the file's pages resident beside the
// copies. It does so only where the source lies in a read-only or shared
// file mapping: there the data stays valid, and a later read (Embed of a
// tied embedding) faults the page back in, from the page cache while it
// is still there (the page cache is the kernel's to reclaim, and keeps a
// restart from reading the file from disk again). Memory of the Go heap
// or of a private anonymous mapping would read back as zeros, so it is
// left alone.
type sourceReleaser struct {
	src    []byte
	done   int     // bytes of src released so far
	ok     bool    // src is file-backed and may be released
	lo, hi uintptr // the file mappings around src, which may be advised
}

func newSourceReleaser(src []byte) sourceReleaser {
	lo, hi, ok := fileMappings(src)
	return sourceReleaser{src: src, ok: ok, lo: lo, hi: hi}
}

// upTo releases the pages of src[:n] not released yet, once they amount
// to a few MiB or n is the end.
func (r *sourceReleaser) upTo(n int) {
	const chunk = 4 << 20
	if !r.ok || n <= r.done || (n-r.done < chunk && n < len(r.src)) {
		return
	}
	_ = syscall.Madvise(pagesAround(r.src, r.done, n), madvDontNeed) // advice only
	r.done = n
}

// finish releases the rest of src and turns off readahead for it: what
// is read from there later are single rows. It also releases what
// reading src mapped beyond its ends: the kernel maps the page cache's
// folios around a faulting page (up to a huge page's worth), which would
// leave the small tensors between two weights (norms, already copied
// out) resident. It only ever advises the file mappings around src.
func (r *sourceReleaser) finish() {
	if !r.ok {
		return
	}
	r.upTo(len(r.src))
	_ = syscall.Madvise(pagesAround(r.src, 0, len(r.src)), madvRandom)
	base := uintptrOf(r.src)
	lo := max((base&^(faultSpan-1))-faultSpan, r.lo)
	hi := min((base+uintptr(len(r.src))+faultSpan-1)&^(faultSpan-1)+faultSpan, r.hi)
	around := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(r.src)), int(lo)-int(base))), hi-lo)
	_ = syscall.Madvise(around, madvDontNeed)
}

// faultSpan bounds what the kernel maps in around a faulting page of a
// file mapping whose page cache is there: fault_around_bytes (64 KiB by
// default), or the whole large folio the page belongs to, up to a huge
// page (2 MiB). Measured on Linux 6.18: about 400 KiB a read.
const faultSpan = 2 << 20

// releaseRow drops the pages that reading row, a row of src, mapped in
// (faultSpan around it, within src's pages) from the process's page
// tables; src is a file-backed weight whose packed copy serves the
// matmuls. Without it every token embedded from a tied embedding would
// leave up to a few hundred KiB of it resident.
func releaseRow(row, src []byte) {
	if len(row) == 0 {
		return
	}
	base := uintptrOf(src)
	lo := int(uintptrOf(row) - base)
	hi := lo + len(row)
	wlo := int((base+uintptr(lo))&^(faultSpan-1)) - int(base)
	whi := int((base+uintptr(hi)+faultSpan-1)&^(faultSpan-1)) - int(base)
	_ = syscall.Madvise(pagesAround(src, max(wlo, 0), min(whi, len(src))), madvDontNeed)
}

// fileMappings reports whether all of b lies in a shared mapping of a
// file (from /proc/self/maps), where MADV_DONTNEED loses no data, and the
// run [lo, hi) of that file's shared mappings, one after the other, that
// holds b (madvise splits one mapping into several). Private mappings are
// left out even when read-only: pages written before they were made so
// (relocations) would revert to the file's.
func fileMappings(b []byte) (lo, hi uintptr, ok bool) {
	if len(b) == 0 {
		return 0, 0, false
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, 0, false
	}
	defer f.Close()
	blo, bhi := uint64(uintptrOf(b)), uint64(uintptrOf(b))+uint64(len(b))
	var runLo, runHi uint64 // the current run of one file's shared mappings
	var runFile string      // its device and inode
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m, ok := parseMapping(sc.Bytes())
		if !ok {
			continue
		}
		if m.start >= bhi && runHi < bhi {
			return 0, 0, false // past b, which is not covered
		}
		switch {
		case m.shared && m.start == runHi && m.file == runFile:
			runHi = m.end
		case m.shared:
			runLo, runHi, runFile = m.start, m.end, m.file
		default:
			runLo, runHi, runFile = 0, 0, ""
		}
		if runHi >= bhi && runLo <= blo && runHi != 0 {
			// Extend the run over the file's next mappings, then stop.
			for sc.Scan() {
				m, ok := parseMapping(sc.Bytes())
				if !ok || !m.shared || m.start != runHi || m.file != runFile {
					break
				}
				runHi = m.end
			}
			return uintptr(runLo), uintptr(runHi), true
		}
	}
	return 0, 0, false
}

// mapping is one line of /proc/self/maps, as far as fileMappings reads it.
type mapping struct {
	start, end uint64
	shared     bool   // a shared mapping of a file
	file       string // its device and inode
}

// parseMapping reads a line "start-end perms offset dev inode [path]".
func parseMapping(line []byte) (mapping, bool) {
	fields := bytes.Fields(line)
	if len(fields) < 5 {
		return mapping{}, false
	}
	dash := bytes.IndexByte(fields[0], '-')
	if dash < 0 {
		return mapping{}, false
	}
	start, err1 := strconv.ParseUint(string(fields[0][:dash]), 16, 64)
	end, err2 := strconv.ParseUint(string(fields[0][dash+1:]), 16, 64)
	if err1 != nil || err2 != nil {
		return mapping{}, false
	}
	return mapping{
		start:  start,
		end:    end,
		shared: len(fields[1]) >= 4 && fields[1][3] == 's' && string(fields[4]) != "0",
		file:   string(fields[3]) + " " + string(fields[4]),
	}, true
}

// mapKV returns n zeroed bytes mapped outside the Go heap, with transparent
// huge pages requested, and the function that unmaps them. Attention reads
// a sequence's blocks scattered over each layer's array, a few KiB each:
// with 4 KiB pages nearly every block costs a TLB miss (decode at 4096
// positions ran 8–15 % slower). The price is residency in 2 MiB steps: at
// most one partly used huge page per layer array beyond the blocks written
// (and the whole store is resident once the prefix cache has filled it).
func mapKV(n int) ([]byte, func(), error) {
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, nil, err
	}
	_ = syscall.Madvise(b, 14) // MADV_HUGEPAGE; advice only
	return b, func() { _ = syscall.Munmap(b) }, nil
}
