package model

import (
	"runtime"
	"runtime/debug"

	"tandem/hal"
)

// Prefault makes the weights ready before the first request instead of
// during it: when be is a hal.WeightPreparer, each matrix is copied into the
// backend's layout in turn (one weight's file pages resident at a time, so
// the peak stays near the final size); a matrix the backend reads in place
// has every page of its bytes read, so a mapped file is resident. An
// untied token embedding is neither: Embed reads a row per token, and the
// rows never used need not be resident. progress, if not nil, is called
// as it goes.
func (m *Model) Prefault(be hal.Backend, progress func(done, total int64)) {
	prep, _ := be.(hal.WeightPreparer)
	weights := m.matrices()
	var total, done int64
	for _, w := range weights {
		total += int64(len(w.Data))
	}
	last := int64(0)
	report := func() {
		if progress != nil && (done-last >= 64<<20 || done == total) {
			progress(done, total)
			last = done
		}
	}
	for _, w := range weights {
		if prep == nil || !prep.PrepareWeight(w) {
			touch(w.Data)
		}
		done += int64(len(w.Data))
		report()
	}
	if progress != nil && last != total {
		progress(total, total)
	}
	// Loading leaves garbage (the file's metadata as parsed, tokenizer
	// tables under construction): hand it back to the system now rather
	// than whenever the scavenger gets to it.
	debug.FreeOSMemory()
}

// touch reads one byte of every page of b.
func touch(b []byte) {
	const page = 4096
	var sink byte
	for i := 0; i < len(b); i += page {
		sink += b[i]
	}
	runtime.KeepAlive(sink) // the loads are the point: keep them
}

// Matrices lists the distinct weight matrices the matmuls read, the ones a
// backend may prepare: the output matrix (the token embedding itself when
// tied), then each layer's q, k, v, o, gate, up and down.
func (m *Model) Matrices() []*hal.Weight { return m.matrices() }

// matrices lists the distinct weight matrices the matmuls read: the
// token embedding only when it is also the output matrix.
func (m *Model) matrices() []*hal.Weight {
	out := []*hal.Weight{m.Output}
	for i := range m.Layers {
		l := &m.Layers[i]
		out = append(out, l.Wq, l.Wk, l.Wv, l.Wo, l.Gate, l.Up, l.Down)
	}
	return out
}
