package cpu

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// KVFormat names the block format of the CPU's KV store (hal.KVStore.Format): within a
// block of a layer, keys are [kv head][dim][slot] and values [kv head][slot][dim], as
// attention reads them, float32 or FP16 as the layout's DType says, little-endian. The
// version changes whenever that order does, so that engines of different builds refuse each
// other's blocks instead of misreading them.
const KVFormat = "cpu-kv/1"

// errBigEndian: the store keeps native elements, and the format is little-endian.
var errBigEndian = errors.New("cpu: KV block I/O needs a little-endian host")

func littleEndian() bool { return binary.NativeEndian.Uint16([]byte{1, 0}) == 1 }

// Format is KVFormat, or "" on a big-endian host, whose stores hold big-endian elements.
func (s *kvStore) Format() string {
	if !littleEndian() {
		return ""
	}
	return KVFormat
}

// ReadBlock copies block's keys and values, layer by layer, into dst.
func (s *kvStore) ReadBlock(block int, dst []byte) error {
	sz, err := s.blockIO(block, len(dst))
	if err != nil {
		return err
	}
	o := block * sz
	for l := range s.kb {
		copy(dst[2*l*sz:(2*l+1)*sz], s.kb[l][o:o+sz])
		copy(dst[(2*l+1)*sz:(2*l+2)*sz], s.vb[l][o:o+sz])
	}
	return nil
}

// WriteBlock stores src as block's keys and values.
func (s *kvStore) WriteBlock(block int, src []byte) error {
	sz, err := s.blockIO(block, len(src))
	if err != nil {
		return err
	}
	o := block * sz
	for l := range s.kb {
		copy(s.kb[l][o:o+sz], src[2*l*sz:(2*l+1)*sz])
		copy(s.vb[l][o:o+sz], src[(2*l+1)*sz:(2*l+2)*sz])
	}
	return nil
}

// blockIO checks a block read or write of n bytes and returns the bytes of one
// block in one layer's key (or value) array.
func (s *kvStore) blockIO(block, n int) (int, error) {
	l := s.layout
	switch {
	case !littleEndian():
		return 0, errBigEndian
	case block < 0 || block >= l.Blocks:
		return 0, fmt.Errorf("cpu: KV block %d of %d", block, l.Blocks)
	case n != l.BlockBytes():
		return 0, fmt.Errorf("cpu: KV block I/O of %d bytes, a block is %d", n, l.BlockBytes())
	}
	return s.blockLen() * l.ElemBytes(), nil
}
