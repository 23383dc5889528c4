package kvtier

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"tandem/kvcache"
)

var testFormat = kvcache.BlockFormat{Store: "cpu-kv/1", DType: "f32", BlockSize: 4, Layers: 2, KVHeads: 1, HeadDim: 8}

var testID = Identity{Salt: 0x5eed, Model: 0xfeed, Format: testFormat}

// block returns deterministic bytes for hash h.
func block(h uint64) []byte {
	b := make([]byte, testFormat.BlockBytes())
	r := rand.New(rand.NewPCG(h, 1))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// sealed fills host slot s with block h.
func sealed(t *testing.T, host *Host, s int32, h uint64) {
	t.Helper()
	copy(host.Slot(s), block(h))
	host.Seal(s, h)
}

func TestHostChecksEveryRead(t *testing.T) {
	host, err := NewHost(4, testFormat.BlockBytes())
	if err != nil {
		t.Fatal(err)
	}
	sealed(t, host, 2, 77)
	if b, err := host.Read(2, 77); err != nil || !bytes.Equal(b, block(77)) {
		t.Fatalf("read: %v", err)
	}
	if _, err := host.Read(2, 78); !errors.Is(err, ErrMismatch) {
		t.Fatalf("read of another hash: %v", err)
	}
	host.Slot(2)[5] ^= 1
	if _, err := host.Read(2, 77); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of a flipped bit: %v", err)
	}
	if _, err := host.Read(3, 77); !errors.Is(err, ErrMismatch) {
		t.Fatalf("read of an empty slot: %v", err)
	}
}

// diskWith opens a disk tier in dir and writes blocks 100+i into slots i from a host arena.
func diskWith(t *testing.T, dir string, n int) *Disk {
	t.Helper()
	d, restored, _, err := OpenDisk(dir, 16, testID)
	if err != nil {
		t.Fatal(err)
	}
	if len(restored) != 0 {
		t.Fatalf("a new directory restores %d blocks", len(restored))
	}
	host, _ := NewHost(n, testFormat.BlockBytes())
	hdr := alignedBuf(headerSize)
	for i := range n {
		sealed(t, host, int32(i), uint64(100+i))
		if err := d.Write(int32(i), uint64(100+i), uint64(99+i), 3, host, int32(i), hdr); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// TestDiskFaults plants every fault of a block file: each is detected with its kind and
// the other blocks still read.
func TestDiskFaults(t *testing.T) {
	dir := t.TempDir()
	d := diskWith(t, dir, 6)
	defer d.Close()
	buf := d.NewBuffer()
	for i := range 6 {
		if b, err := d.Read(int32(i), uint64(100+i), buf); err != nil || !bytes.Equal(b, block(uint64(100+i))) {
			t.Fatalf("slot %d: %v", i, err)
		}
	}
	// A flipped bit in the payload, a truncated file, a deleted one, a header overwritten,
	// another model's block, a block of another format.
	flip(t, d.path(0), headerSize+10)
	truncate(t, d.path(1), int64(headerSize+100))
	os.Remove(d.path(2))
	flip(t, d.path(3), 20)
	other := Identity{Salt: 0x5eed, Model: 0xbad, Format: testFormat}
	plant(t, d.path(4), other, 104)
	wide := testFormat
	wide.BlockSize = 8
	plant(t, d.path(5), Identity{Salt: 0x5eed, Model: 0xfeed, Format: wide}, 105)
	want := []error{ErrCorrupt, ErrCorrupt, ErrMissing, ErrCorrupt, ErrMismatch, ErrMismatch}
	for i, w := range want {
		if _, err := d.Read(int32(i), uint64(100+i), buf); !errors.Is(err, w) {
			t.Errorf("slot %d: %v, want %v", i, err, w)
		}
	}
	// The wrong hash in a sound file.
	d2 := diskWith(t, t.TempDir(), 1)
	defer d2.Close()
	if _, err := d2.Read(0, 101, d2.NewBuffer()); !errors.Is(err, ErrMismatch) {
		t.Errorf("read of slot 0 as another block: %v", err)
	}
	// The directory gone.
	gone := t.TempDir()
	d3 := diskWith(t, gone, 2)
	defer d3.Close()
	os.RemoveAll(gone)
	if _, err := d3.Read(0, 100, d3.NewBuffer()); !errors.Is(err, ErrGone) {
		t.Errorf("read with the directory gone: %v", err)
	}
	host, _ := NewHost(1, testFormat.BlockBytes())
	sealed(t, host, 0, 9)
	if err := d3.Write(0, 9, 0, 1, host, 0, alignedBuf(headerSize)); !errors.Is(err, ErrGone) {
		t.Errorf("write with the directory gone: %v", err)
	}
	if err := d3.Healthy(); !errors.Is(err, ErrGone) {
		t.Errorf("probe with the directory gone: %v", err)
	}
}

// TestDiskFull writes into a full device: /dev/full answers every write with ENOSPC, and
// the tier's temporary file is made to be it.
func TestDiskFull(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full on this system, the one device that is always full")
	}
	dir := t.TempDir()
	d, _, _, err := OpenDisk(dir, 4, testID)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := os.Symlink("/dev/full", d.path(1)+".tmp"); err != nil {
		t.Fatal(err)
	}
	host, _ := NewHost(1, testFormat.BlockBytes())
	sealed(t, host, 0, 9)
	err = d.Write(1, 9, 0, 1, host, 0, alignedBuf(headerSize))
	if !errors.Is(err, ErrFull) || Kind(err) != "full" {
		t.Fatalf("write to a full disk: %v", err)
	}
	if _, err := os.Lstat(d.path(1)); err == nil {
		t.Fatal("a failed write left a block file")
	}
	if d.Direct() && d.DirectRefused.Load() == 0 {
		t.Fatal("/dev/full refused O_DIRECT uncounted")
	}
}

// TestDiskRestart: a reopened directory re-indexes its blocks and reports the rest.
func TestDiskRestart(t *testing.T) {
	dir := t.TempDir()
	d := diskWith(t, dir, 5)
	if _, _, _, err := OpenDisk(dir, 16, testID); err == nil {
		t.Fatal("a second process opened a locked disk tier")
	}
	d.Close()
	flip(t, d.path(1), 30)                                                    // a bad header: removed
	plant(t, d.path(2), Identity{Salt: 1, Model: 2, Format: testFormat}, 102) // another model's
	os.WriteFile(d.path(3)+".tmp", []byte("half"), 0o600)                     // a write cut short
	os.Rename(d.path(4), filepath.Join(dir, "00000020.kvb"))                  // beyond a capacity of 16
	d2, restored, rep, err := OpenDisk(dir, 16, testID)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if len(restored) != 2 || rep != (ScanReport{Restored: 2, Foreign: 1, Corrupt: 1, Beyond: 1, Temp: 1}) {
		t.Fatalf("restored %v, report %+v", restored, rep)
	}
	got := map[int32]kvcache.Restored{}
	for _, r := range restored {
		got[r.Slot] = r
	}
	if got[0] != (kvcache.Restored{Slot: 0, Hash: 100, Parent: 99, Uses: 3}) || got[3].Hash != 103 {
		t.Fatalf("restored %+v", restored)
	}
	if _, err := d2.Read(2, 102, d2.NewBuffer()); !errors.Is(err, ErrMismatch) {
		t.Fatalf("read of another model's block: %v", err)
	}
}

// TestSharedTwoWriters: two engines write the same and different blocks into one shared
// directory at once; every block reads back whole from either, and each sees the other's.
func TestSharedTwoWriters(t *testing.T) {
	root := t.TempDir()
	var engines [2]*Shared
	var hosts [2]*Host
	for i := range engines {
		s, err := OpenShared(root, testID)
		if err != nil {
			t.Fatal(err)
		}
		engines[i] = s
		hosts[i], _ = NewHost(64, testFormat.BlockBytes())
	}
	var wg sync.WaitGroup
	for i := range engines {
		wg.Go(func() {
			hdr := alignedBuf(headerSize)
			for j := range 64 {
				h := uint64(1000 + j) // half the blocks both write, half one each
				if j%2 == 1 {
					h += uint64(i) * 100000
				}
				copy(hosts[i].Slot(int32(j)), block(h))
				hosts[i].Seal(int32(j), h)
				if _, err := engines[i].Write(h, 0, 2, hosts[i], int32(j), hdr); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	for i, s := range engines {
		added, gone, err := s.Scan()
		if err != nil || len(gone) != 0 {
			t.Fatalf("scan: %v, gone %v", err, gone)
		}
		_ = added
		buf := s.NewBuffer()
		for j := range 64 {
			for k := range 2 {
				h := uint64(1000 + j)
				if j%2 == 1 {
					h += uint64(k) * 100000
				}
				b, err := s.Read(h, buf)
				if err != nil || !bytes.Equal(b, block(h)) {
					t.Fatalf("engine %d reading %d: %v", i, h, err)
				}
			}
		}
	}
	// The files another writer's crash left, and a block of another model dropped in.
	plant(t, filepath.Join(engines[0].Dir(), fmt.Sprintf("%016x.kvb", 5)), Identity{Salt: 3, Model: 4, Format: testFormat}, 5)
	if _, err := engines[1].Read(5, engines[1].NewBuffer()); !errors.Is(err, ErrMismatch) {
		t.Fatalf("read of another model's block: %v", err)
	}
}

func flip(t *testing.T, path string, at int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	f.ReadAt(b, at)
	b[0] ^= 0x10
	f.WriteAt(b, at)
}

func truncate(t *testing.T, path string, n int64) {
	t.Helper()
	if err := os.Truncate(path, n); err != nil {
		t.Fatal(err)
	}
}

// plant writes a sound block file of identity id and hash h at path.
func plant(t *testing.T, path string, id Identity, h uint64) {
	t.Helper()
	bb := id.Format.BlockBytes()
	b := make([]byte, headerSize+stride(bb))
	data := bytes.Repeat([]byte{7}, bb)
	copy(b[headerSize:], data)
	putHeader(b, fileHeader{payload: bb, hash: h, salt: id.Salt, model: id.Model, crc: CRC(data), format: id.Format.String()})
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}
