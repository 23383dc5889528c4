package cpu

import (
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"

	"tandem/hal"
)

// TestFileMappings: only shared file mappings may have their pages dropped
// (MADV_DONTNEED would zero the Go heap or an anonymous mapping, and revert
// a private mapping's written pages), and the bytes read back after a drop
// are the file's.
func TestFileMappings(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w")
	want := make([]byte, 3<<20)
	for i := range want {
		want[i] = byte(i*7 + i>>12)
	}
	if err := os.WriteFile(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mmap := func(flags int) []byte {
		b, err := syscall.Mmap(int(f.Fd()), 0, len(want), syscall.PROT_READ, flags)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Munmap(b) })
		return b
	}
	anon, err := syscall.Mmap(-1, 0, 1<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(anon)
	shared := mmap(syscall.MAP_SHARED)
	for _, tc := range []struct {
		name string
		b    []byte
		ok   bool
	}{
		{"heap", make([]byte, 1<<20), false},
		{"anonymous", anon, false},
		{"private file", mmap(syscall.MAP_PRIVATE), false},
		{"shared file", shared, true},
		{"inside a shared file", shared[5000 : 2<<20], true},
		{"empty", nil, false},
	} {
		lo, hi, ok := fileMappings(tc.b)
		if ok != tc.ok {
			t.Errorf("%s: ok %v, want %v", tc.name, ok, tc.ok)
		}
		if ok && (lo > uintptrOf(tc.b) || hi < uintptrOf(tc.b)+uintptr(len(tc.b))) {
			t.Errorf("%s: run [%#x, %#x) does not hold [%#x, +%d)", tc.name, lo, hi, uintptrOf(tc.b), len(tc.b))
		}
	}

	// Dropping the pages of a shared mapping loses nothing; heap bytes are
	// left alone.
	for _, b := range [][]byte{shared[100 : len(shared)-100], append([]byte(nil), want...)} {
		r := newSourceReleaser(b)
		for n := 0; n < len(b); n += 1 << 20 {
			r.upTo(min(n+1<<20, len(b)))
		}
		r.finish()
		if r.ok { // as Embed does, only for a released weight
			releaseRow(b[4096:5000], b)
		}
		for i, c := range b {
			if w := want[i+(len(want)-len(b))/2]; c != w {
				t.Fatalf("byte %d reads %d after the pages were dropped, want %d", i, c, w)
			}
		}
	}
}

// TestKVStoreOffHeap: the KV store's arrays lie outside the Go heap, so
// that a large cache does not raise the collector's goal past the garbage
// of a whole server's life; they read as zeros and hold what is written.
func TestKVStoreOffHeap(t *testing.T) {
	be := New(1)
	defer be.Close()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	l := hal.KVLayout{Layers: 4, Blocks: 1024, BlockSize: 16, KVHeads: 8, HeadDim: 64} // 256 MiB
	st, err := be.NewKVStore(l)
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 16<<20 {
		t.Errorf("a %d-byte KV store grew the Go heap by %d bytes", st.Bytes(), grew)
	}
	k, v := st.(*kvStore).k, st.(*kvStore).v
	per := l.Blocks * l.BlockSize * l.KVHeads * l.HeadDim
	for i := range l.Layers {
		if len(k[i]) != per || len(v[i]) != per || cap(k[i]) != per {
			t.Fatalf("layer %d: arrays of %d and %d floats (cap %d), want %d", i, len(k[i]), len(v[i]), cap(k[i]), per)
		}
		k[i][0], k[i][per-1], v[i][0], v[i][per-1] = float32(i), float32(i+1), float32(i+2), float32(i+3)
	}
	for i := range l.Layers {
		if k[i][0] != float32(i) || k[i][per-1] != float32(i+1) || v[i][0] != float32(i+2) || v[i][per-1] != float32(i+3) || k[i][per/2] != 0 {
			t.Fatalf("layer %d does not hold what was written", i)
		}
	}
	runtime.KeepAlive(st)
}
