package cpu

import (
	"fmt"
	"math"

	"tandem/hal"
)

// kvStore keeps each layer's keys and values block-major: within a block,
// one KV head's BlockSize positions are contiguous, so attention streams a
// head's keys through cache in order.
type kvStore struct {
	layout hal.KVLayout
	k, v   [][]float32 // per layer
}

// NewKVStore allocates a paged key/value store in host memory.
func (b *Backend) NewKVStore(l hal.KVLayout) (hal.KVStore, error) {
	if l.Layers <= 0 || l.Blocks <= 0 || l.BlockSize <= 0 || l.KVHeads <= 0 || l.HeadDim <= 0 {
		return nil, fmt.Errorf("cpu: invalid KV layout %+v", l)
	}
	per := l.Blocks * l.BlockSize * l.KVHeads * l.HeadDim
	s := &kvStore{layout: l, k: make([][]float32, l.Layers), v: make([][]float32, l.Layers)}
	for i := range s.k {
		s.k[i] = make([]float32, per)
		s.v[i] = make([]float32, per)
	}
	return s, nil
}

func (s *kvStore) Layout() hal.KVLayout { return s.layout }

func (s *kvStore) Bytes() int64 {
	l := s.layout
	return int64(l.Layers) * 2 * int64(l.Blocks*l.BlockSize*l.KVHeads*l.HeadDim) * 4
}

func (s *kvStore) blockLen() int { return s.layout.BlockSize * s.layout.KVHeads * s.layout.HeadDim }

func (s *kvStore) CopyBlock(dst, src int) {
	n := s.blockLen()
	for l := range s.k {
		copy(s.k[l][dst*n:(dst+1)*n], s.k[l][src*n:(src+1)*n])
		copy(s.v[l][dst*n:(dst+1)*n], s.v[l][src*n:(src+1)*n])
	}
}

// offset is where (block, head, slot) starts in a layer's array.
func (s *kvStore) offset(block, head, slot int) int {
	l := s.layout
	return ((block*l.KVHeads+head)*l.BlockSize + slot) * l.HeadDim
}

// StoreKV writes each token's keys and values at its position.
func (b *Backend) StoreKV(store hal.KVStore, layer int, k, v []float32, batch *hal.AttnBatch) {
	s := store.(*kvStore)
	l := s.layout
	row := l.KVHeads * l.HeadDim
	for t, p := range batch.Pos {
		blocks := batch.Blocks[batch.SeqOf[t]]
		blk := int(blocks[int(p)/l.BlockSize])
		slot := int(p) % l.BlockSize
		for h := 0; h < l.KVHeads; h++ {
			o := s.offset(blk, h, slot)
			copy(s.k[layer][o:o+l.HeadDim], k[t*row+h*l.HeadDim:t*row+(h+1)*l.HeadDim])
			copy(s.v[layer][o:o+l.HeadDim], v[t*row+h*l.HeadDim:t*row+(h+1)*l.HeadDim])
		}
	}
}

// Attention computes, for each token and head, softmax(q·Kᵀ·scale)·V over
// positions 0..pos of the token's sequence. Each (token, head) is computed
// alone with a fixed order over positions, so the result does not depend on
// the batch, the chunking, or the prefill/decode path.
func (b *Backend) Attention(out, q []float32, heads int, scale float32, store hal.KVStore, layer int, batch *hal.AttnBatch) {
	s := store.(*kvStore)
	l := s.layout
	hd := l.HeadDim
	group := heads / l.KVHeads
	maxPos := int32(0)
	for _, p := range batch.Pos {
		maxPos = max(maxPos, p)
	}
	kl, vl := s.k[layer], s.v[layer]
	b.pool.run(len(batch.Pos)*heads, func(worker, lo, hi int) {
		scores := b.workerScratch(worker, int(maxPos)+1)
		for i := lo; i < hi; i++ {
			t, h := i/heads, i%heads
			kvh := h / group
			n := int(batch.Pos[t]) + 1
			blocks := batch.Blocks[batch.SeqOf[t]]
			qh := q[(t*heads+h)*hd : (t*heads+h+1)*hd]
			sc := scores[:n]
			maxScore := float32(math.Inf(-1))
			for j := 0; j < n; j++ {
				o := s.offset(int(blocks[j/l.BlockSize]), kvh, j%l.BlockSize)
				d := dotF32(qh, kl[o:o+hd]) * scale
				sc[j] = d
				maxScore = max(maxScore, d)
			}
			var sum float64
			for j, v := range sc {
				e := float32(math.Exp(float64(v - maxScore)))
				sc[j] = e
				sum += float64(e)
			}
			inv := float32(1 / sum)
			oh := out[(t*heads+h)*hd : (t*heads+h+1)*hd]
			clear(oh)
			for j, w := range sc {
				o := s.offset(int(blocks[j/l.BlockSize]), kvh, j%l.BlockSize)
				axpy(oh, vl[o:o+hd], w*inv)
			}
		}
	})
}

// dotF32 sums in float32 in index order; the order is fixed, so results are
// reproducible for any batch.
func dotF32(a, b []float32) float32 {
	b = b[:len(a)]
	var s float32
	for i, v := range a {
		s += v * b[i]
	}
	return s
}

func axpy(dst, x []float32, a float32) {
	x = x[:len(dst)]
	for i := range dst {
		dst[i] += a * x[i]
	}
}
