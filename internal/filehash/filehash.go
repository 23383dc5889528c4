// Package filehash names a model by the content of its files (SHA-256), and remembers the
// name by the files' identity (device, inode, size, modification and change times), so
// that a restart, which must know it before it may use prepared weights, does not read
// gigabytes again.
//
// Why a real content hash, and why the memo is keyed as it is: the hash decides whether a
// pack cache or a peer's prepared weights may stand in for this file's, and a wrong yes
// serves another model's weights with this one's tokenizer, which nothing downstream
// notices. Size and mtime alone, or with a hash of sampled chunks, say yes for two files
// that differ outside the samples (two fine-tunes or quantizations of one shape differ
// everywhere, but a file with one tensor replaced, a merged adapter or corrected metadata
// of the same length, differs in a few places), and peers on other machines share neither
// inodes nor mtimes. So the name is the SHA-256 of every byte, which is also the digest
// model hubs publish (a Hugging Face LFS object id). Computing it costs a read of the file
// (about 1 s a GiB here), once: the memo maps the file's identity to its hash, and the
// identity changes with any write (mtime and ctime; ctime cannot be set back from user
// space, as mtime can with touch or cp -p) or replacement (inode). A hash is remembered
// only when the file was last changed well before it was read (the "racy git" rule: a
// write within the timestamps' granularity of the read would leave them unchanged).
package filehash

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"tandem/internal/statefile"
)

// Sum is a SHA-256 content hash.
type Sum [sha256.Size]byte

// String is the hash in hex.
func (s Sum) String() string { return hex.EncodeToString(s[:]) }

// IsZero reports whether s is the zero value (no hash).
func (s Sum) IsZero() bool { return s == Sum{} }

// Parse reads a hash written by String.
func Parse(h string) (Sum, error) {
	var s Sum
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != len(s) {
		return Sum{}, fmt.Errorf("filehash: %q is not a SHA-256 in hex", h)
	}
	copy(s[:], b)
	return s, nil
}

// MemoFile is the memo's file name in its directory.
const MemoFile = "content-hashes.json"

// racyWindow is how long before the read a file must have last changed for its hash to
// be remembered: more than any file system's timestamp granularity (FAT's is 2 s). A
// variable for the tests, whose files are always fresh.
var racyWindow = 3 * time.Second

// Result is a model's content hash and how it was had.
type Result struct {
	Sum Sum
	// Read is the bytes hashed now (0: every file's hash was remembered).
	Read int64
}

// Of returns the content hash of the model at path: a file's SHA-256, or, for a directory
// (a Hugging Face checkout), the SHA-256 of its regular files' names, sizes and hashes in
// name order. Hashes are remembered in memoDir (none when ""), which is created if need be.
func Of(path, memoDir string) (Result, error) {
	m := &memo{dir: memoDir}
	m.load()
	st, err := os.Stat(path)
	if err != nil {
		return Result{}, err
	}
	var res Result
	if !st.IsDir() {
		res.Sum, res.Read, err = m.file(path)
	} else {
		res, err = m.directory(path)
	}
	if err != nil {
		return Result{}, err
	}
	if err := m.save(); err != nil {
		return Result{}, fmt.Errorf("filehash: remembering the hash in %s: %w", memoDir, err)
	}
	return res, nil
}

// Bytes returns the SHA-256 of data (the built-in demo model, which has no file).
func Bytes(data []byte) Sum { return sha256.Sum256(data) }

func (m *memo) directory(dir string) (Result, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return Result{}, err
	}
	h := sha256.New()
	var res Result
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		if e.Type().IsRegular() && e.Name()[0] != '.' {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	for _, name := range names {
		sum, read, err := m.file(filepath.Join(dir, name))
		if err != nil {
			return Result{}, err
		}
		res.Read += read
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(name)))
		h.Write(n[:])
		h.Write([]byte(name))
		h.Write(sum[:])
	}
	copy(res.Sum[:], h.Sum(nil))
	return res, nil
}

// memo maps files' identities to their hashes.
type memo struct {
	dir     string
	entries map[string]memoEntry // by absolute path
	changed bool
}

// memoEntry is a file's identity and hash.
type memoEntry struct {
	Identity identity `json:"identity"`
	SHA256   string   `json:"sha256"`
}

// identity is what changes when a file's content may have.
type identity struct {
	Dev     uint64 `json:"dev"`
	Ino     uint64 `json:"ino"`
	Size    int64  `json:"size"`
	MtimeNs int64  `json:"mtime_ns"`
	CtimeNs int64  `json:"ctime_ns"`
}

// memoMu serializes the memo's read-modify-write among the goroutines of a process
// (several engines in one test); processes sharing a directory may lose each other's
// entries, never corrupt the file (statefile.Write is atomic).
var memoMu sync.Mutex

func (m *memo) load() {
	m.entries = map[string]memoEntry{}
	if m.dir == "" {
		return
	}
	memoMu.Lock()
	defer memoMu.Unlock()
	b, err := os.ReadFile(filepath.Join(m.dir, MemoFile))
	if err != nil {
		return // absent: nothing remembered yet
	}
	if json.Unmarshal(b, &m.entries) != nil {
		m.entries = map[string]memoEntry{} // damaged: hash again, and rewrite it
		m.changed = true
	}
}

func (m *memo) save() error {
	if m.dir == "" || !m.changed {
		return nil
	}
	memoMu.Lock()
	defer memoMu.Unlock()
	b, err := json.MarshalIndent(m.entries, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(m.dir, 0o755); err != nil {
		return err
	}
	return statefile.Write(filepath.Join(m.dir, MemoFile), append(b, '\n'), 0o644)
}

// file returns the SHA-256 of the file at path, from the memo when its identity is the
// remembered one, and how many bytes it read.
func (m *memo) file(path string) (Sum, int64, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return Sum{}, 0, err
	}
	f, err := os.Open(abs)
	if err != nil {
		return Sum{}, 0, err
	}
	defer f.Close()
	before, known := fileIdentity(f)
	if e, ok := m.entries[abs]; ok && known && e.Identity == before {
		if s, err := Parse(e.SHA256); err == nil {
			return s, 0, nil
		}
	}
	start := time.Now()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return Sum{}, 0, &fs.PathError{Op: "read", Path: abs, Err: err}
	}
	var s Sum
	copy(s[:], h.Sum(nil))
	after, _ := fileIdentity(f)
	settled := start.Add(-racyWindow).UnixNano()
	if known && after == before && before.MtimeNs < settled && before.CtimeNs < settled {
		m.entries[abs] = memoEntry{Identity: before, SHA256: s.String()}
		m.changed = true
	} else if _, ok := m.entries[abs]; ok {
		delete(m.entries, abs)
		m.changed = true
	}
	return s, n, nil
}
