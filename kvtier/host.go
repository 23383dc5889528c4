package kvtier

import (
	"fmt"
	"sync/atomic"
)

// Host is the host-memory tier's arena: a slot per block the pool's books name, each
// aligned to 4096 bytes (a disk write reads it with O_DIRECT), with the hash and CRC of
// what was sealed into it. On the CPU backend it is a second arena beside the engine's KV
// store; a GPU backend would allocate it as pinned memory.
//
// A slot is written by one goroutine (the pool reserves it for the copy) and read by
// others only after the pool has marked it ready, under the pool's lock; so the slots need
// no lock of their own.
type Host struct {
	bb, stride int
	mem        []byte
	meta       []hostMeta

	Reads, Corrupt atomic.Uint64
}

type hostMeta struct {
	hash uint64
	crc  uint32
	ok   bool
}

// NewHost returns an arena of slots blocks of blockBytes bytes.
func NewHost(slots, blockBytes int) (*Host, error) {
	if slots <= 0 || blockBytes <= 0 {
		return nil, fmt.Errorf("kvtier: a host tier of %d blocks of %d bytes", slots, blockBytes)
	}
	st := stride(blockBytes)
	if int64(slots)*int64(st) > 1<<46 {
		return nil, fmt.Errorf("kvtier: a host tier of %d blocks of %d bytes is too large", slots, blockBytes)
	}
	return &Host{bb: blockBytes, stride: st, mem: alignedBuf(slots * st), meta: make([]hostMeta, slots)}, nil
}

// Slots is the arena's capacity in blocks.
func (h *Host) Slots() int { return len(h.meta) }

// Bytes is the memory the arena holds.
func (h *Host) Bytes() int64 { return int64(len(h.mem)) }

// Slot returns slot s's block bytes, to copy a block into before Seal.
func (h *Host) Slot(s int32) []byte {
	o := int(s) * h.stride
	return h.mem[o : o+h.bb : o+h.stride]
}

// padded returns slot s with its padding, as a disk write with O_DIRECT takes it.
func (h *Host) padded(s int32) []byte {
	o := int(s) * h.stride
	return h.mem[o : o+h.stride]
}

// Seal records that slot s holds the block of sequence hash hash (its bytes written).
func (h *Host) Seal(s int32, hash uint64) {
	h.meta[s] = hostMeta{hash: hash, crc: CRC(h.Slot(s)), ok: true}
}

// Read returns slot s's bytes after checking that it holds block hash, intact (the slice
// is the arena's: valid while the pool keeps the slot pinned).
func (h *Host) Read(s int32, hash uint64) ([]byte, error) {
	h.Reads.Add(1)
	m := h.meta[s]
	b := h.Slot(s)
	switch {
	case !m.ok || m.hash != hash:
		h.Corrupt.Add(1)
		return nil, fmt.Errorf("%w: host slot %d holds %#016x, not %#016x", ErrMismatch, s, m.hash, hash)
	case CRC(b) != m.crc:
		h.Corrupt.Add(1)
		return nil, fmt.Errorf("%w: host slot %d (%#016x): checksum %08x, sealed %08x", ErrCorrupt, s, hash, CRC(b), m.crc)
	}
	return b, nil
}

// sealed returns slot s's hash and CRC as sealed.
func (h *Host) sealed(s int32) (uint64, uint32, bool) {
	m := h.meta[s]
	return m.hash, m.crc, m.ok
}
