// Package packcache keeps a backend's prepared weights (hal/cpu's packed copies) in a file
// that the next start maps in place and uses without preparing them again, checked against
// the model's content hash, the backend and its kernels' features, and the file format.
//
// The file: an 8-byte magic, the format version, the length and CRC-32C of a JSON header
// (the key, and per weight its name, type, shape, prepared format, offset, size and CRC-32C),
// then, from the first page after the header, each weight's bytes at a page-aligned offset. It is written whole and renamed into
// place (internal/statefile), never changed where it lies: a running engine computes from
// its mapping, and a file truncated under a mapping would fault it.
package packcache

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"tandem/hal"
	"tandem/internal/filehash"
	"tandem/internal/statefile"
)

// FormatVersion is the version of the file's layout and header.
const FormatVersion = 1

const (
	magic     = "TNDMPACK"
	preamble  = 8 + 4 + 4 + 4 // magic, version, header length, header CRC
	dataAlign = 4096          // each weight's offset: a page, so the mapping's pieces align
	maxHeader = 64 << 20
)

// Key is what a cache must have been made for to be used.
type Key struct {
	Model   filehash.Sum // the model's content hash
	Backend string       // hal.WeightPorter.PreparedKey: the backend and its kernels' features
}

// The reasons a cache is not used. Load wraps them with what it found.
var (
	ErrAbsent  = errors.New("no pack cache")
	ErrStale   = errors.New("stale pack cache")
	ErrCorrupt = errors.New("corrupt pack cache")
)

// castagnoli is CRC-32C's table (SSE 4.2 computes it: several GB/s a core).
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Path is the cache file of the model at modelPath in dir: one file per model path (its
// base name and a hash of the absolute path), so that a changed model or a changed CPU
// finds its old cache stale and replaces it rather than leaving it behind.
func Path(dir, modelPath string) string {
	if modelPath == "" {
		return filepath.Join(dir, "demo-model.tpack")
	}
	abs, err := filepath.Abs(modelPath)
	if err != nil {
		abs = modelPath
	}
	h := sha256.Sum256([]byte(abs))
	return filepath.Join(dir, filepath.Base(abs)+"-"+hex.EncodeToString(h[:6])+".tpack")
}

// header is the file's JSON header.
type header struct {
	Model   string  `json:"model_sha256"`
	Backend string  `json:"backend"`
	Weights []entry `json:"weights"`
}

type entry struct {
	Name   string `json:"name"`
	Type   string `json:"type"`
	Rows   int    `json:"rows"`
	Cols   int    `json:"cols"`
	Format string `json:"format"`
	Offset int64  `json:"offset"`
	Size   int64  `json:"size"`
	CRC    uint32 `json:"crc32c"`
}

// Prepared returns the weights of ws that have a prepared form on be: those a cache holds.
func Prepared(be hal.WeightPorter, ws []*hal.Weight) []*hal.Weight {
	var out []*hal.Weight
	for _, w := range ws {
		if _, _, ok := be.PreparedFormat(w); ok {
			out = append(out, w)
		}
	}
	return out
}

// Save writes the prepared forms of ws that be has (making those it lacks) to path, and
// returns the file's size. The old file at path is replaced only once the new one is
// complete and synced; ctx ends the writing early, leaving the old one.
func Save(ctx context.Context, path string, key Key, be hal.WeightPorter, ws []*hal.Weight) (int64, error) {
	ws = Prepared(be, ws)
	h := header{Model: key.Model.String(), Backend: key.Backend}
	forms := make([][]byte, len(ws))
	for i, w := range ws {
		p, ok := be.ExportWeight(w)
		if !ok {
			return 0, fmt.Errorf("packcache: weight %s has no prepared form", w.Name)
		}
		forms[i] = p.Data
		h.Weights = append(h.Weights, entry{Name: w.Name, Type: w.Type.String(), Rows: w.Rows, Cols: w.Cols,
			Format: p.Format, Size: int64(len(p.Data))})
	}
	// Offsets count from the data's start, the first page after the header.
	var off int64
	for i := range ws {
		h.Weights[i].CRC = crc32.Checksum(forms[i], castagnoli)
		h.Weights[i].Offset = off
		off = align(off + h.Weights[i].Size)
		if err := ctx.Err(); err != nil {
			return 0, err
		}
	}
	hdr, err := json.Marshal(&h)
	if err != nil {
		return 0, err
	}
	start := align(preamble + int64(len(hdr)))
	var size int64
	err = statefile.WriteWith(path, 0o644, func(f *os.File) error {
		pre := make([]byte, preamble)
		copy(pre, magic)
		binary.LittleEndian.PutUint32(pre[8:], FormatVersion)
		binary.LittleEndian.PutUint32(pre[12:], uint32(len(hdr)))
		binary.LittleEndian.PutUint32(pre[16:], crc32.Checksum(hdr, castagnoli))
		w := &offsetWriter{f: f}
		if err := w.write(pre); err != nil {
			return err
		}
		if err := w.write(hdr); err != nil {
			return err
		}
		for i, e := range h.Weights {
			if err := w.padTo(start + e.Offset); err != nil {
				return err
			}
			for b := forms[i]; len(b) > 0; {
				if err := ctx.Err(); err != nil {
					return err
				}
				n := min(len(b), 8<<20)
				if err := w.write(b[:n]); err != nil {
					return err
				}
				b = b[n:]
			}
		}
		size = w.off
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("packcache: writing %s: %w", path, err)
	}
	return size, nil
}

func align(n int64) int64 { return (n + dataAlign - 1) &^ (dataAlign - 1) }

type offsetWriter struct {
	f   *os.File
	off int64
}

func (w *offsetWriter) write(b []byte) error {
	n, err := w.f.Write(b)
	w.off += int64(n)
	return err
}

func (w *offsetWriter) padTo(off int64) error {
	if off < w.off {
		return fmt.Errorf("offset %d behind %d", off, w.off)
	}
	return w.write(make([]byte, off-w.off))
}

// Loaded describes a cache that Load used.
type Loaded struct {
	Weights int   // weights imported
	Bytes   int64 // their prepared bytes
}

// Load maps the cache at path and gives be the prepared forms of ws from it, after
// checking the key, every weight's name, type, shape, format and size against be's and
// every byte against its CRC-32C (on workers goroutines). Every weight of ws with a
// prepared form on be must be there. On any error nothing is imported and the file is
// unmapped; the error wraps ErrAbsent, ErrStale or ErrCorrupt, saying what was found.
func Load(path string, key Key, be hal.WeightPorter, ws []*hal.Weight, workers int) (Loaded, error) {
	data, unmap, err := mapFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return Loaded{}, fmt.Errorf("%w at %s", ErrAbsent, path)
	}
	if err != nil {
		return Loaded{}, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	ld, err := load(data, key, be, ws, workers, unmap)
	if err != nil {
		unmap()
		return Loaded{}, err
	}
	return ld, nil
}

func load(data []byte, key Key, be hal.WeightPorter, ws []*hal.Weight, workers int, unmap func()) (Loaded, error) {
	corrupt := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	if len(data) < preamble || string(data[:8]) != magic {
		return Loaded{}, corrupt("not a pack cache file (%d bytes)", len(data))
	}
	if v := binary.LittleEndian.Uint32(data[8:]); v != FormatVersion {
		return Loaded{}, fmt.Errorf("%w: file format %d, this build writes %d", ErrStale, v, FormatVersion)
	}
	n := int64(binary.LittleEndian.Uint32(data[12:]))
	if n > maxHeader || preamble+n > int64(len(data)) {
		return Loaded{}, corrupt("header of %d bytes in a file of %d", n, len(data))
	}
	hdr := data[preamble : preamble+n]
	start := align(preamble + n)
	if crc32.Checksum(hdr, castagnoli) != binary.LittleEndian.Uint32(data[16:]) {
		return Loaded{}, corrupt("the header's checksum does not match")
	}
	var h header
	dec := json.NewDecoder(bytes.NewReader(hdr))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return Loaded{}, corrupt("header: %v", err)
	}
	switch {
	case h.Model != key.Model.String():
		return Loaded{}, fmt.Errorf("%w: made for the model with content hash %.12s…, this one's is %.12s…", ErrStale, h.Model, key.Model.String())
	case h.Backend != key.Backend:
		return Loaded{}, fmt.Errorf("%w: made for backend %q, this one is %q", ErrStale, h.Backend, key.Backend)
	}
	byName := make(map[string]*entry, len(h.Weights))
	for i := range h.Weights {
		byName[h.Weights[i].Name] = &h.Weights[i]
	}
	ws = Prepared(be, ws)
	ps := make([]hal.Prepared, len(ws))
	es := make([]*entry, len(ws))
	var total int64
	for i, w := range ws {
		format, size, _ := be.PreparedFormat(w)
		e := byName[w.Name]
		switch {
		case e == nil:
			return Loaded{}, fmt.Errorf("%w: weight %s is not in it", ErrStale, w.Name)
		case e.Type != w.Type.String() || e.Rows != w.Rows || e.Cols != w.Cols:
			return Loaded{}, fmt.Errorf("%w: weight %s is %s %dx%d there, %v %dx%d here", ErrStale, w.Name, e.Type, e.Rows, e.Cols, w.Type, w.Rows, w.Cols)
		case e.Format != format || e.Size != int64(size):
			return Loaded{}, fmt.Errorf("%w: weight %s is %s (%d bytes) there, %s (%d bytes) here", ErrStale, w.Name, e.Format, e.Size, format, size)
		case e.Offset < 0 || e.Offset%dataAlign != 0 || start+e.Offset+e.Size > int64(len(data)):
			return Loaded{}, corrupt("weight %s at %d+%d lies outside the file's %d bytes", w.Name, start+e.Offset, e.Size, len(data))
		}
		es[i] = e
		lo, hi := start+e.Offset, start+e.Offset+e.Size
		ps[i] = hal.Prepared{Format: e.Format, Data: data[lo:hi:hi]}
		total += e.Size
	}
	if bad := verify(ps, es, workers); bad != nil {
		return Loaded{}, corrupt("weight %s's bytes do not match their checksum", bad.Name)
	}
	if err := be.ImportWeights(ws, ps, unmap); err != nil {
		return Loaded{}, fmt.Errorf("%w: %v", ErrStale, err)
	}
	return Loaded{Weights: len(ws), Bytes: total}, nil
}

// verify checks every form's CRC on workers goroutines, the largest first, and returns
// the entry of one that does not match.
func verify(ps []hal.Prepared, es []*entry, workers int) *entry {
	var next atomic.Int64
	var bad atomic.Pointer[entry]
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(ps) || bad.Load() != nil {
					return
				}
				if crc32.Checksum(ps[i].Data, castagnoli) != es[i].CRC {
					bad.Store(es[i])
				}
			}
		})
	}
	wg.Wait()
	return bad.Load()
}

// Describe names a Load error's kind for logs and metrics: "absent", "stale" or "corrupt".
func Describe(err error) string {
	switch {
	case errors.Is(err, ErrAbsent):
		return "absent"
	case errors.Is(err, ErrStale):
		return "stale"
	default:
		return "corrupt"
	}
}
