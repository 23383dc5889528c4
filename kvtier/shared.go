package kvtier

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"tandem/kvcache"
)

// Shared is the cluster-wide tier: a directory that every node mounts (a network
// filesystem), with one file per block named by its sequence hash, under a subdirectory of
// the model's identity. Several engines write to it at once: each writes a temporary file
// of its own and renames it into place, so a reader sees a whole block or none (two
// engines writing the same block rename the same bytes over each other); every read checks
// the header and the CRC, and a file a crash or another program mangled is refused.
//
// The engine does not bound or clean the directory: whoever mounts it sizes it (and may
// remove old files, which engines notice at their next scan or read).
type Shared struct {
	dir  string
	id   Identity
	bb   int
	size int

	mu    sync.Mutex
	known map[uint64]bool // blocks the last scan (or this engine's writes) saw

	Reads, ReadBytes, Writes, WriteBytes, Skipped atomic.Uint64
}

// SharedSubdir is the directory of identity id's blocks under a shared root.
func SharedSubdir(root string, id Identity) string {
	f := id.Format
	return filepath.Join(root, fmt.Sprintf("%016x-%016x", id.Salt, id.Model),
		strings.NewReplacer("/", "-", " ", "", ",", "_").Replace(fmt.Sprintf("%s-%s-b%d-l%d-h%d-d%d", f.Store, f.DType, f.BlockSize, f.Layers, f.KVHeads, f.HeadDim)))
}

// OpenShared opens (creating it if needed) identity id's directory under root.
func OpenShared(root string, id Identity) (*Shared, error) {
	bb := id.Format.BlockBytes()
	if bb <= 0 {
		return nil, fmt.Errorf("kvtier: shared tier: blocks of %d bytes", bb)
	}
	dir := SharedSubdir(root, id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("kvtier: shared tier: %w", err)
	}
	return &Shared{dir: dir, id: id, bb: bb, size: headerSize + stride(bb), known: map[uint64]bool{}}, nil
}

// Dir is the directory of this identity's blocks.
func (s *Shared) Dir() string { return s.dir }

// NewBuffer returns a buffer for Read.
func (s *Shared) NewBuffer() []byte { return alignedBuf(s.size) }

func (s *Shared) path(hash uint64) string {
	return filepath.Join(s.dir, fmt.Sprintf("%016x.kvb", hash))
}

// Scan lists the directory: the blocks that appeared since the last scan (for
// kvcache.Pool.Restore, in any slot) and those that disappeared (for Forget). Temporary
// files older than an hour (a writer that crashed) are removed.
func (s *Shared) Scan() (added []kvcache.Restored, gone []uint64, err error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		if _, serr := os.Stat(s.dir); serr != nil {
			return nil, nil, fmt.Errorf("%w: %s: %w", ErrGone, s.dir, err)
		}
		return nil, nil, err
	}
	seen := make(map[uint64]bool, len(ents))
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") {
			if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) > time.Hour {
				os.Remove(filepath.Join(s.dir, name))
			}
			continue
		}
		hx, ok := strings.CutSuffix(name, ".kvb")
		if !ok || len(hx) != 16 {
			continue
		}
		h, err := strconv.ParseUint(hx, 16, 64)
		if err != nil {
			continue
		}
		seen[h] = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for h := range seen {
		if !s.known[h] {
			added = append(added, kvcache.Restored{Slot: -1, Hash: h})
		}
	}
	for h := range s.known {
		if !seen[h] {
			gone = append(gone, h)
		}
	}
	s.known = seen
	return added, gone, nil
}

// Write stores block hash from host slot src of h (checked first) unless the directory
// has it already (another engine wrote it): it reports whether it wrote.
func (s *Shared) Write(hash, parent uint64, uses uint32, h *Host, src int32, header []byte) (bool, error) {
	if _, err := os.Stat(s.path(hash)); err == nil {
		s.Skipped.Add(1)
		s.note(hash)
		return false, nil
	}
	if err := sealHeader(header, s.id, s.bb, h, src, hash, parent, uses); err != nil {
		return false, err
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := s.path(hash) + "." + hex.EncodeToString(rnd[:]) + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return false, s.fail(err)
	}
	if err := writeBlockFile(f, tmp, s.path(hash), header, h.padded(src)); err != nil {
		return false, s.fail(err)
	}
	s.Writes.Add(1)
	s.WriteBytes.Add(uint64(s.size))
	s.note(hash)
	return true, nil
}

func (s *Shared) note(hash uint64) {
	s.mu.Lock()
	s.known[hash] = true
	s.mu.Unlock()
}

// Read reads block hash's file into buf (NewBuffer's) and returns its bytes, checked.
func (s *Shared) Read(hash uint64, buf []byte) ([]byte, error) {
	f, err := os.Open(s.path(hash))
	if err != nil {
		return nil, s.fail(err)
	}
	return readBlockFile(f, s.size, buf, s.id, hash, fmt.Sprintf("shared block %#016x", hash), s.fail, &s.Reads, &s.ReadBytes)
}

func (s *Shared) fail(err error) error {
	if os.IsNotExist(err) {
		if _, serr := os.Stat(s.dir); serr != nil {
			return fmt.Errorf("%w: %s: %w", ErrGone, s.dir, err)
		}
	}
	return classify(err)
}
