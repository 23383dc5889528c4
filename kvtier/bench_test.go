package kvtier

import (
	"os"
	"sync"
	"testing"
	"time"

	"tandem/kvcache"
)

// benchFormat is a block of the Qwen2.5-0.5B shape (24 layers, 2 KV heads of 64, 16
// tokens, f32): 384 KiB.
var benchFormat = kvcache.BlockFormat{Store: "cpu-kv/1", DType: "f32", BlockSize: 16, Layers: 24, KVHeads: 2, HeadDim: 64}

const benchBlocks = 64

// benchDisk writes benchBlocks block files in a new directory (set TANDEM_BENCH_DIR to
// measure another disk than the one holding the temporary directory).
func benchDisk(b *testing.B) *Disk {
	b.Helper()
	dir := b.TempDir()
	if d := os.Getenv("TANDEM_BENCH_DIR"); d != "" {
		var err error
		if dir, err = os.MkdirTemp(d, "kvtier-bench"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
	}
	id := Identity{Salt: 1, Model: 2, Format: benchFormat}
	d, _, _, err := OpenDisk(dir, benchBlocks, id)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Close() })
	host, err := NewHost(1, benchFormat.BlockBytes())
	if err != nil {
		b.Fatal(err)
	}
	hdr := alignedBuf(headerSize)
	for i := range benchBlocks {
		p := host.Slot(0)
		for j := range p {
			p[j] = byte(i + j)
		}
		host.Seal(0, uint64(1000+i))
		if err := d.Write(int32(i), uint64(1000+i), 0, 2, host, 0, hdr); err != nil {
			b.Fatal(err)
		}
	}
	return d
}

// BenchmarkBlockCRC is the payload check's part of a checked read (BenchmarkDiskReadSideBySide).
func BenchmarkBlockCRC(b *testing.B) {
	p := make([]byte, benchFormat.BlockBytes())
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		CRC(p)
	}
}

// BenchmarkDiskReadSideBySide reads each block file twice in turn, the disk tier's way
// (Disk.Read, checked) and raw, alternating which goes first, and reports both speeds and
// their ratio (checked/raw): the same bytes, the same disk, at the same moment.
func BenchmarkDiskReadSideBySide(b *testing.B) {
	d := benchDisk(b)
	buf := d.NewBuffer()
	var checked, raw time.Duration
	readRaw := func(s int32) {
		f, err := d.open(s, os.O_RDONLY)
		if err != nil {
			b.Fatal(err)
		}
		if n, err := f.ReadAt(buf, 0); n != len(buf) {
			b.Fatal(n, err)
		}
		f.Close()
	}
	readChecked := func(s int32) {
		if _, err := d.Read(s, uint64(1000+s), buf); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	for b.Loop() {
		s := int32(i % benchBlocks)
		t0 := time.Now()
		if i%2 == 0 {
			readChecked(s)
			t1 := time.Now()
			readRaw(s)
			checked, raw = checked+t1.Sub(t0), raw+time.Since(t1)
		} else {
			readRaw(s)
			t1 := time.Now()
			readChecked(s)
			raw, checked = raw+t1.Sub(t0), checked+time.Since(t1)
		}
		i++
	}
	mb := float64(i) * float64(d.FileBytes()) / 1e6
	b.ReportMetric(mb/checked.Seconds(), "checked_MB/s")
	b.ReportMetric(mb/raw.Seconds(), "raw_MB/s")
	b.ReportMetric(raw.Seconds()/checked.Seconds(), "checked/raw")
	b.Logf("direct I/O: %v", d.Direct())
}

// BenchmarkDiskReadSideBySideStriped is BenchmarkDiskReadSideBySide with 4 reads in flight
// each way, as an onboarding sequence's 4 stripes read (engine.load): 4 goroutines read
// checked, then the same 4 blocks raw, alternating which goes first.
func BenchmarkDiskReadSideBySideStriped(b *testing.B) {
	const k = 4
	d := benchDisk(b)
	bufs := make([][]byte, k)
	for i := range bufs {
		bufs[i] = d.NewBuffer()
	}
	var checked, raw time.Duration
	readAll := func(first int32, verify bool) time.Duration {
		t0 := time.Now()
		var wg sync.WaitGroup
		for j := range int32(k) {
			wg.Go(func() {
				s := (first + j) % benchBlocks
				if verify {
					if _, err := d.Read(s, uint64(1000+s), bufs[j]); err != nil {
						b.Error(err)
					}
					return
				}
				f, err := d.open(s, os.O_RDONLY)
				if err != nil {
					b.Error(err)
					return
				}
				if n, err := f.ReadAt(bufs[j], 0); n != len(bufs[j]) {
					b.Error(n, err)
				}
				f.Close()
			})
		}
		wg.Wait()
		return time.Since(t0)
	}
	i := 0
	for b.Loop() {
		first := int32(i * k % benchBlocks)
		if i%2 == 0 {
			checked += readAll(first, true)
			raw += readAll(first, false)
		} else {
			raw += readAll(first, false)
			checked += readAll(first, true)
		}
		i++
	}
	mb := float64(i*k) * float64(d.FileBytes()) / 1e6
	b.ReportMetric(mb/checked.Seconds(), "checked_MB/s")
	b.ReportMetric(mb/raw.Seconds(), "raw_MB/s")
	b.ReportMetric(raw.Seconds()/checked.Seconds(), "checked/raw")
}
