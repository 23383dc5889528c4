package model

import "tandem/hal"

// Prefault reads one byte of every page of the weights, so that a mapped
// file is resident before the first request instead of during it. progress,
// if not nil, is called as it goes.
func (m *Model) Prefault(progress func(done, total int64)) {
	const page = 4096
	var total, done int64
	weights := m.matrices()
	for _, w := range weights {
		total += int64(len(w))
	}
	var sink byte
	for _, w := range weights {
		for i := 0; i < len(w); i += page {
			sink += w[i]
			if done += page; progress != nil && done%(64<<20) == 0 {
				progress(min(done, total), total)
			}
		}
	}
	if progress != nil {
		progress(total, total)
	}
	_ = sink
}

// matrices lists the distinct weight matrices' bytes.
func (m *Model) matrices() [][]byte {
	out := [][]byte{m.Embedding.Data}
	if m.Output != m.Embedding {
		out = append(out, m.Output.Data)
	}
	for i := range m.Layers {
		l := &m.Layers[i]
		for _, w := range []*hal.Weight{l.Wq, l.Wk, l.Wv, l.Wo, l.Gate, l.Up, l.Down} {
			out = append(out, w.Data)
		}
	}
	return out
}
