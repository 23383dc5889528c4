package kvtier

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"tandem/internal/statefile"
	"tandem/kvcache"
)

// Disk is the local disk tier: one file per slot of the pool's books, SLOT.kvb in its
// directory, written to a temporary file and renamed (a crash leaves the old block or the
// new one, never half of one; a torn file fails its checksum), read whole with one
// aligned read. Files are opened with O_DIRECT where the filesystem allows it, so that the
// host tier, not the page cache, is what holds blocks in memory. One process uses a
// directory at a time (it is locked).
//
// Every method may be called from any goroutine; the pool's books keep two copies from
// using one slot at once.
type Disk struct {
	dir      string
	id       Identity
	bb, size int // block bytes; file bytes (header and padded block)
	slots    int
	direct   bool
	unlock   func()

	Reads, ReadBytes, Writes, WriteBytes atomic.Uint64
	// DirectRefused counts files that refused O_DIRECT although the directory took it (and
	// were then used through the page cache).
	DirectRefused atomic.Uint64
}

// ScanReport is what OpenDisk found in the directory.
type ScanReport struct {
	Restored int // block files of this model, format and weights, re-indexed
	Foreign  int // sound block files of another model, weights or format: not used, overwritten in time
	Corrupt  int // unreadable block files (bad header): removed
	Beyond   int // block files of slots past the capacity (the size was lowered): removed
	Temp     int // temporary files of writes a crash cut short: removed
}

// OpenDisk opens (creating it if needed) the disk tier in dir with room for slots blocks
// of identity id, locks it for this process, and scans it: the block files of id are
// returned for the pool's books (kvcache.Pool.Restore), the others are reported.
func OpenDisk(dir string, slots int, id Identity) (*Disk, []kvcache.Restored, ScanReport, error) {
	var rep ScanReport
	bb := id.Format.BlockBytes()
	if slots <= 0 || bb <= 0 {
		return nil, nil, rep, fmt.Errorf("kvtier: a disk tier of %d blocks of %d bytes", slots, bb)
	}
	unlock, err := statefile.Lock(dir)
	if err != nil {
		return nil, nil, rep, fmt.Errorf("kvtier: disk tier: %w", err)
	}
	d := &Disk{dir: dir, id: id, bb: bb, size: headerSize + stride(bb), slots: slots, unlock: unlock}
	d.direct = probeDirect(dir)
	restored, rep, err := d.scan()
	if err != nil {
		unlock()
		return nil, nil, rep, err
	}
	return d, restored, rep, nil
}

// Close releases the directory's lock.
func (d *Disk) Close() error {
	if d.unlock != nil {
		d.unlock()
		d.unlock = nil
	}
	return nil
}

// Dir is the tier's directory; Direct reports whether its files use O_DIRECT.
func (d *Disk) Dir() string  { return d.dir }
func (d *Disk) Direct() bool { return d.direct }

// FileBytes is the size of one block file: what a read or write of a block moves.
func (d *Disk) FileBytes() int { return d.size }

// NewBuffer returns a buffer for Read (one per reading goroutine).
func (d *Disk) NewBuffer() []byte { return alignedBuf(d.size) }

func (d *Disk) path(slot int32) string {
	return filepath.Join(d.dir, fmt.Sprintf("%08d.kvb", slot))
}

// scan re-indexes the directory's block files.
func (d *Disk) scan() ([]kvcache.Restored, ScanReport, error) {
	var rep ScanReport
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, rep, fmt.Errorf("kvtier: disk tier: %w", err)
	}
	var out []kvcache.Restored
	buf := alignedBuf(headerSize)
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") {
			os.Remove(filepath.Join(d.dir, name))
			rep.Temp++
			continue
		}
		num, ok := strings.CutSuffix(name, ".kvb")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		slot, err := strconv.Atoi(num)
		if err != nil || slot < 0 {
			continue
		}
		if slot >= d.slots {
			os.Remove(filepath.Join(d.dir, name))
			rep.Beyond++
			continue
		}
		h, err := d.readHeader(int32(slot), buf)
		switch {
		case errors.Is(err, ErrMismatch):
			rep.Foreign++
			continue
		case err != nil:
			os.Remove(filepath.Join(d.dir, name))
			rep.Corrupt++
			continue
		}
		if err := d.id.check(h); err != nil {
			rep.Foreign++
			continue
		}
		out = append(out, kvcache.Restored{Slot: int32(slot), Hash: h.hash, Parent: h.parent, Uses: h.uses})
		rep.Restored++
	}
	return out, rep, nil
}

func (d *Disk) readHeader(slot int32, buf []byte) (fileHeader, error) {
	f, err := d.open(slot, os.O_RDONLY)
	if err != nil {
		return fileHeader{}, err
	}
	defer f.Close()
	n, err := f.ReadAt(buf[:headerSize], 0)
	if n < headerSize {
		if err == nil || err == io.EOF {
			err = fmt.Errorf("%w: %d bytes", ErrCorrupt, n)
		}
		return fileHeader{}, err
	}
	if fi, err := f.Stat(); err != nil || fi.Size() != int64(d.size) {
		return fileHeader{}, fmt.Errorf("%w: truncated", ErrCorrupt)
	}
	return parseHeader(buf)
}

func (d *Disk) open(slot int32, flag int) (*os.File, error) {
	return d.openPath(d.path(slot), flag)
}

// openPath opens name with O_DIRECT if the directory takes it; a file that refuses it is
// opened through the page cache (and counted).
func (d *Disk) openPath(name string, flag int) (*os.File, error) {
	if d.direct {
		f, err := os.OpenFile(name, flag|oDirect, 0o600)
		if !errors.Is(err, syscall.EINVAL) {
			if err != nil {
				return nil, d.fail(err)
			}
			return f, nil
		}
		d.DirectRefused.Add(1)
	}
	f, err := os.OpenFile(name, flag, 0o600)
	if err != nil {
		return nil, d.fail(err)
	}
	return f, nil
}

// fail classifies an error, telling a missing file from a missing directory.
func (d *Disk) fail(err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(d.dir); serr != nil {
			return fmt.Errorf("%w: %s: %w", ErrGone, d.dir, err)
		}
	}
	return classify(err)
}

// Write stores block hash (parent parent, used uses times) in slot from host slot src of
// h, which must hold it: the host copy is checked first, so a corrupt host slot never
// reaches the disk.
func (d *Disk) Write(slot int32, hash, parent uint64, uses uint32, h *Host, src int32, header []byte) error {
	if err := sealHeader(header, d.id, d.bb, h, src, hash, parent, uses); err != nil {
		return err
	}
	tmp := d.path(slot) + ".tmp"
	f, err := d.openPath(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
	if err != nil {
		return err
	}
	if err := writeBlockFile(f, tmp, d.path(slot), header, h.padded(src)); err != nil {
		return d.fail(err)
	}
	d.Writes.Add(1)
	d.WriteBytes.Add(uint64(d.size))
	return nil
}

// Read reads slot's file whole into buf (NewBuffer's) and returns the block's bytes, after
// checking that the file is a block of this identity with sequence hash hash, intact.
func (d *Disk) Read(slot int32, hash uint64, buf []byte) ([]byte, error) {
	f, err := d.open(slot, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	return readBlockFile(f, d.size, buf, d.id, hash, fmt.Sprintf("disk slot %d", slot), d.fail, &d.Reads, &d.ReadBytes)
}

// Healthy reports whether the directory is there and takes a block file's worth of
// bytes: a probe after failures.
func (d *Disk) Healthy() error {
	f, err := os.CreateTemp(d.dir, "probe-*.tmp")
	if err != nil {
		return d.fail(err)
	}
	name := f.Name()
	_, err = f.Write(make([]byte, d.size))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	os.Remove(name)
	return classify(err)
}

// probeDirect reports whether files in dir can be opened with O_DIRECT.
func probeDirect(dir string) bool {
	if oDirect == 0 {
		return false
	}
	f, err := os.CreateTemp(dir, "direct-*.tmp")
	if err != nil {
		return false
	}
	name := f.Name()
	f.Close()
	defer os.Remove(name)
	g, err := os.OpenFile(name, os.O_RDWR|oDirect, 0)
	if err != nil {
		return false
	}
	defer g.Close()
	_, err = g.WriteAt(alignedBuf(align), 0)
	return err == nil
}
