package node

import (
	"encoding/binary"
	"hash/fnv"
	"math"

	"tandem/hal"
	"tandem/model"
)

// WeightsFingerprint names a model's weights for the block files of the KV disk and shared
// tiers: two engines that serve different weights under one name share the block hash
// salt, and each other's KV would make wrong output, so a block file records the
// fingerprint and one of other weights is never read. It hashes (FNV-1a) the config, every
// tensor's name, type and shape, the bytes of three 4 KiB windows of each matrix (its start,
// middle and end: a few MB for any model, read from the mapped file) and every vector.
func WeightsFingerprint(m *model.Model) uint64 {
	h := fnv.New64a()
	var b [8]byte
	num := func(v int) {
		binary.LittleEndian.PutUint64(b[:], uint64(v))
		h.Write(b[:])
	}
	c := m.Config
	h.Write([]byte(c.Arch))
	for _, v := range []int{c.Layers, c.Embd, c.Heads, c.KVHeads, c.HeadDim, c.FFN, c.VocabSize} {
		num(v)
	}
	const window = 4096
	matrix := func(w *hal.Weight) {
		if w == nil {
			num(-1)
			return
		}
		h.Write([]byte(w.Name))
		num(int(w.Type))
		num(w.Rows)
		num(w.Cols)
		d := w.Data
		for _, at := range []int{0, len(d)/2 - window/2, len(d) - window} {
			at = max(0, at)
			h.Write(d[at:min(len(d), at+window)])
		}
	}
	vector := func(v []float32) {
		num(len(v))
		for _, x := range v {
			binary.LittleEndian.PutUint32(b[:4], math.Float32bits(x))
			h.Write(b[:4])
		}
	}
	matrix(m.Embedding)
	for i := range m.Layers {
		l := &m.Layers[i]
		for _, w := range []*hal.Weight{l.Wq, l.Wk, l.Wv, l.Wo, l.Gate, l.Up, l.Down} {
			matrix(w)
		}
		for _, v := range [][]float32{l.AttnNorm, l.Bq, l.Bk, l.Bv, l.QNorm, l.KNorm, l.FFNNorm} {
			vector(v)
		}
	}
	vector(m.OutputNorm)
	matrix(m.Output)
	return h.Sum64()
}
