package sim

// Disaggregated prefill and decode in the simulator, as the live router runs them
// (docs/disaggregation.md): router.DecideDisagg picks a decode worker D and, when the
// prompt tokens D lacks reach the threshold and the prefill pool is not busy, a prefill
// worker P. P prefills the prompt with its own scheduler (a twin record with one output
// token); the blocks of each chunk leave P for D as the chunk's step ends, one transfer at
// a time over P's link, paced by Timing.Transfer (only the blocks past D's cached
// prefix move); P's first token is the client's first token. When the last block has
// arrived, D imports the blocks into its prefix cache (kvcache.Seq Match, Reserve,
// Commit, as engine.Import does), the request joins D's scheduler, computes the partial
// last block (its first token is the echo of P's, not counted again) and decodes on.
// A D without room for the import computes the prompt itself.

import (
	"errors"
	"fmt"

	"tandem/planner"
	"tandem/router"
	"tandem/sched"
)

// twinBit marks a twin's sequence id: twins are not in sim.reqs.
const twinBit = 1 << 62

func poolOf(role string) planner.Pool {
	p, _ := planner.PoolOfRole(role)
	return p
}

// dispatchDisagg routes r in a disaggregated cluster; false when it must wait.
func (s *sim) dispatchDisagg(r *sreq, req router.Request) bool {
	dd, err := router.DecideDisagg(s.state, req, s.cfg.Disagg)
	if errors.Is(err, router.ErrAllBusy) || errors.Is(err, router.ErrNoWorkers) && s.waitForWorkers() {
		return false
	}
	if err != nil {
		s.fail(r, err.Error())
		return true
	}
	d := dd.Decode
	r.inflight = d.Inflight
	w := s.workers[d.Worker]
	r.worker = w.id
	w.stats.Requests++
	if !w.sched.Fits(len(r.Tokens)) {
		s.state.RemoveInflight(r.inflight)
		if dd.Prefill != nil {
			s.state.RemoveInflight(dd.Prefill.Inflight)
		}
		s.fail(r, fmt.Sprintf("sim: %d tokens exceed the KV capacity of %d blocks", len(r.Tokens), s.cfg.KVBlocks))
		return true
	}
	if dd.Prefill != nil && r.outLen > 1 {
		p := s.workers[dd.Prefill.Worker]
		t := &sreq{Seq: sched.Seq{ID: r.ID | twinBit, Priority: r.Priority, PromptLen: r.PromptLen}, parent: r,
			worker: p.id, outLen: 1, inflight: dd.Prefill.Inflight, at: r.at}
		t.Tokens = append(make([]int32, 0, len(r.Tokens)+1), r.Tokens...)
		t.overlap = d.Overlap
		r.twin = t
		w.imports++
		p.stats.Requests++
		s.remote++
		s.account(p)
		p.sched.Add(t)
		s.kickSoon(p)
		return true
	}
	if dd.Prefill != nil { // one output token: P's answer would be the whole answer; D does it
		s.state.RemoveInflight(dd.Prefill.Inflight)
	}
	s.account(w)
	w.sched.Add(r)
	s.kickSoon(w)
	return true
}

// kickSoon starts w after the other arrivals of this instant.
func (s *sim) kickSoon(w *worker) {
	if !w.stepping && !w.kicking {
		w.kicking = true
		s.push(event{t: s.now, kind: evKick, w: w.id})
	}
}

// transfer sends the full prompt blocks a twin's chunk [from, from+n) computed on P to
// its decode worker, behind P's earlier transfers.
func (s *sim) transfer(p *worker, t *sreq, from, n int) {
	bs := s.cfg.BlockSize
	lo, hi := max(from/bs, t.overlap), min(from+n, t.PromptLen)/bs
	if hi <= lo {
		return
	}
	bytes := int64(hi-lo) * int64(bs) * s.cfg.KVBytesPerToken
	d := s.cfg.Timing.Transfer(bytes)
	if t.xferBytes > 0 { // one pull: its set-up is paid once
		d -= msDur(s.cfg.Timing.TransferBase)
	}
	p.linkFree = max(p.linkFree, s.now) + d
	t.xferEnd, t.xferBytes = p.linkFree, t.xferBytes+bytes
}

// prefilled ends a twin's prefill on P: the client has its first token; D imports the
// blocks once the last one has arrived.
func (s *sim) prefilled(p *worker, t *sreq) {
	r := t.parent
	s.state.PrefillDone(&t.inflight)
	s.account(p)
	p.sched.Finish(t)
	s.state.RemoveInflight(t.inflight)
	t.Tokens = nil
	s.moved += t.xferBytes
	if r.err != "" { // its decode worker failed it meanwhile
		s.workers[r.worker].imports--
		return
	}
	r.first = s.now
	r.firstPool = planner.Prefill
	r.times = append(r.times, s.now)
	s.counters.FirstToken(planner.Prefill, s.now-r.at)
	s.push(event{t: max(s.now, t.xferEnd), kind: evImport, r: r.index()})
}

// importKV enters r's transferred blocks into its decode worker's prefix cache and starts
// r there.
func (s *sim) importKV(r *sreq) {
	w := s.workers[r.worker]
	w.imports--
	bs := s.cfg.BlockSize
	tokens := r.Tokens[:r.PromptLen/bs*bs]
	seq := w.pool.NewSeq(s.salt)
	have := seq.Match(tokens, 0) / bs
	if err := seq.Reserve((len(tokens)/bs - have) * bs); err != nil {
		seq.Release() // no room: D computes the prompt itself
	} else {
		seq.Commit(tokens)
		r.imp = seq
	}
	r.echo = true
	s.account(w)
	w.sched.Add(r)
	s.drain(w)
	s.kickSoon(w)
}
