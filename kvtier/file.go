// Package kvtier holds the bytes of the KV cache's lower tiers (docs/kv-tiers.md): a
// host-memory arena, block files on a local disk, and a directory shared by a cluster,
// every block checked against its hash and a CRC of its bytes when it is read back.
package kvtier

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"tandem/kvcache"
)

// Identity is what a block file must match to be read: the model's block hash salt, a
// fingerprint of its weights (two engines serving different weights under one name share
// the salt, and each other's KV would be wrong output), and the block format.
type Identity struct {
	Salt   uint64
	Model  uint64
	Format kvcache.BlockFormat
}

// Block files (docs/kv-tiers.md, "Block files"): a 4096-byte header, then the block's bytes
// padded to a multiple of 4096, so that a file is read and written with aligned I/O (and
// O_DIRECT where the filesystem allows it). All integers little-endian.
//
//	0    magic "TDMKVB01"
//	8    u32 version (1)
//	12   u32 payload bytes (the format's block bytes)
//	16   u64 sequence hash
//	24   u64 parent's sequence hash
//	32   u64 salt
//	40   u64 model fingerprint
//	48   u32 CRC-32C of the payload
//	52   u32 uses (the frequency filter's count when written)
//	56   u16 length of the format's name, then the name (kvcache.BlockFormat.String())
//	4092 u32 CRC-32C of bytes 0 … 4091
const (
	headerSize  = 4096
	fileMagic   = "TDMKVB01"
	fileVersion = 1
	align       = 4096
	maxFormat   = headerSize - 4 - 58
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC is the checksum of a block's bytes (CRC-32C, as KV transfers use).
func CRC(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Errors of reads and writes; callers count them by Kind.
var (
	// ErrCorrupt: the file's header or bytes fail their checksum, or it is truncated.
	ErrCorrupt = errors.New("kvtier: block corrupt")
	// ErrMismatch: a sound block of another model, weights, format or prompt.
	ErrMismatch = errors.New("kvtier: block of another model, format or prompt")
	// ErrMissing: the block's file is not there (deleted).
	ErrMissing = errors.New("kvtier: block file missing")
	// ErrFull: the disk is full.
	ErrFull = errors.New("kvtier: no space left on the disk")
	// ErrGone: the tier's directory is gone (unmounted, deleted).
	ErrGone = errors.New("kvtier: directory gone")
)

// Kind names err's class for metrics: corrupt, mismatch, missing, full, gone or io.
func Kind(err error) string {
	switch {
	case errors.Is(err, ErrCorrupt):
		return "corrupt"
	case errors.Is(err, ErrMismatch):
		return "mismatch"
	case errors.Is(err, ErrMissing):
		return "missing"
	case errors.Is(err, ErrFull):
		return "full"
	case errors.Is(err, ErrGone):
		return "gone"
	}
	return "io"
}

// classify wraps an OS error in the tier's error of its class.
func classify(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%w: %w", ErrFull, err)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %w", ErrMissing, err)
	}
	return err
}

// stride is the padded size of a block's bytes in a file or an arena slot.
func stride(blockBytes int) int { return (blockBytes + align - 1) / align * align }

// fileHeader is a block file's header fields.
type fileHeader struct {
	payload      int
	hash, parent uint64
	salt, model  uint64
	crc          uint32
	uses         uint32
	format       string
}

// sealHeader checks that host slot src of h holds block hash, intact, so that a corrupt
// host slot never reaches a file, and fills header with that block's file header for
// identity id (payload bb bytes).
func sealHeader(header []byte, id Identity, bb int, h *Host, src int32, hash, parent uint64, uses uint32) error {
	sh, crc, ok := h.sealed(src)
	if !ok || sh != hash {
		return fmt.Errorf("%w: host slot %d holds %#016x, not %#016x", ErrMismatch, src, sh, hash)
	}
	if got := CRC(h.Slot(src)); got != crc {
		return fmt.Errorf("%w: host slot %d: checksum %08x, sealed %08x", ErrCorrupt, src, got, crc)
	}
	putHeader(header, fileHeader{payload: bb, hash: hash, parent: parent, salt: id.Salt, model: id.Model,
		crc: crc, uses: uses, format: id.Format.String()})
	return nil
}

// writeBlockFile writes header and the padded block to f, the temporary file tmp, closes
// it and renames it to name, so that a block file is whole or absent; on an error it
// removes tmp.
func writeBlockFile(f *os.File, tmp, name string, header, padded []byte) error {
	_, err := f.WriteAt(header[:headerSize], 0)
	if err == nil {
		_, err = f.WriteAt(padded, headerSize)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, name)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

func putHeader(b []byte, h fileHeader) {
	clear(b[:headerSize])
	copy(b, fileMagic)
	le := binary.LittleEndian
	le.PutUint32(b[8:], fileVersion)
	le.PutUint32(b[12:], uint32(h.payload))
	le.PutUint64(b[16:], h.hash)
	le.PutUint64(b[24:], h.parent)
	le.PutUint64(b[32:], h.salt)
	le.PutUint64(b[40:], h.model)
	le.PutUint32(b[48:], h.crc)
	le.PutUint32(b[52:], h.uses)
	le.PutUint16(b[56:], uint16(len(h.format)))
	copy(b[58:], h.format)
	le.PutUint32(b[headerSize-4:], CRC(b[:headerSize-4]))
}

// parseHeader reads and checks a header's own integrity (not what it names).
func parseHeader(b []byte) (fileHeader, error) {
	if len(b) < headerSize {
		return fileHeader{}, fmt.Errorf("%w: a header of %d bytes", ErrCorrupt, len(b))
	}
	le := binary.LittleEndian
	if string(b[:8]) != fileMagic {
		return fileHeader{}, fmt.Errorf("%w: not a block file (magic %q)", ErrCorrupt, b[:8])
	}
	if got, want := CRC(b[:headerSize-4]), le.Uint32(b[headerSize-4:]); got != want {
		return fileHeader{}, fmt.Errorf("%w: header checksum %08x, recorded %08x", ErrCorrupt, got, want)
	}
	if v := le.Uint32(b[8:]); v != fileVersion {
		return fileHeader{}, fmt.Errorf("%w: block file version %d (this build reads %d)", ErrMismatch, v, fileVersion)
	}
	n := int(le.Uint16(b[56:]))
	if n > maxFormat {
		return fileHeader{}, fmt.Errorf("%w: format name of %d bytes", ErrCorrupt, n)
	}
	return fileHeader{
		payload: int(le.Uint32(b[12:])), hash: le.Uint64(b[16:]), parent: le.Uint64(b[24:]),
		salt: le.Uint64(b[32:]), model: le.Uint64(b[40:]), crc: le.Uint32(b[48:]), uses: le.Uint32(b[52:]),
		format: string(b[58 : 58+n]),
	}, nil
}

// check verifies that h is a block of id (any hash; the caller checks which).
func (id Identity) check(h fileHeader) error {
	switch {
	case h.salt != id.Salt:
		return fmt.Errorf("%w: salt %#016x, this model's is %#016x", ErrMismatch, h.salt, id.Salt)
	case h.model != id.Model:
		return fmt.Errorf("%w: weights %#016x, this model's are %#016x", ErrMismatch, h.model, id.Model)
	case h.format != id.Format.String():
		return fmt.Errorf("%w: format %q, this engine's is %q", ErrMismatch, h.format, id.Format.String())
	case h.payload != id.Format.BlockBytes():
		return fmt.Errorf("%w: %d bytes a block, this format's are %d", ErrMismatch, h.payload, id.Format.BlockBytes())
	}
	return nil
}

// verify checks a whole file read into b (header, then payload): its integrity, that it
// is a block of id with sequence hash hash, and its payload's CRC. It returns the payload.
func (id Identity) verify(b []byte, hash uint64) ([]byte, error) {
	h, err := parseHeader(b)
	if err != nil {
		return nil, err
	}
	if err := id.check(h); err != nil {
		return nil, err
	}
	if h.hash != hash {
		return nil, fmt.Errorf("%w: the file holds block %#016x, not %#016x", ErrMismatch, h.hash, hash)
	}
	if len(b) < headerSize+h.payload {
		return nil, fmt.Errorf("%w: truncated: %d bytes of %d", ErrCorrupt, len(b), headerSize+h.payload)
	}
	p := b[headerSize : headerSize+h.payload]
	if got := CRC(p); got != h.crc {
		return nil, fmt.Errorf("%w: checksum %08x, recorded %08x", ErrCorrupt, got, h.crc)
	}
	return p, nil
}

// alignedBuf returns n bytes whose first byte is aligned to 4096, for O_DIRECT. The Go
// heap does not move objects, so the alignment lasts.
func alignedBuf(n int) []byte {
	b := make([]byte, n+align)
	off := int(uintptr(unsafe.Pointer(&b[0])) & (align - 1))
	if off != 0 {
		off = align - off
	}
	return b[off : off+n : off+n]
}

// readBlockFile reads a block file of size bytes from f (closing it) into buf and checks
// it against id and hash; what names the block in errors, fail classifies a read error,
// and the read is counted on reads and readBytes. A short file is ErrCorrupt.
func readBlockFile(f *os.File, size int, buf []byte, id Identity, hash uint64, what string,
	fail func(error) error, reads, readBytes *atomic.Uint64) ([]byte, error) {
	n, err := f.ReadAt(buf[:size], 0)
	f.Close()
	reads.Add(1)
	readBytes.Add(uint64(n))
	if n < size {
		if err == nil || err == io.EOF {
			return nil, fmt.Errorf("%w: %s truncated to %d bytes of %d", ErrCorrupt, what, n, size)
		}
		return nil, fail(err)
	}
	p, err := id.verify(buf[:n], hash)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return p, nil
}
