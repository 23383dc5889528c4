package sched

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"tandem/internal/datadriven"
	"tandem/kvcache"
)

// testSeq is a test's record of a sequence: the Seq and how many tokens it generates.
type testSeq struct {
	Seq
	out int
}

// harness runs a data-driven script: it plays the caller's part (the forward pass, the
// sampler and the stop rule "out tokens generated") around a Scheduler.
type harness struct {
	pool  *kvcache.Pool
	s     *Scheduler[*testSeq]
	seqs  map[uint64]*testSeq
	steps int

	// With micro-batches: the steps in flight, oldest first.
	flight   [][]Chunk[*testSeq]
	flightID []int
}

// TestScripts runs the scripts in testdata. Commands:
//
//	new budget=B seqs=S blocks=K block-size=N [itl=T prefill=A+B decode=C+D] [host=H]
//	                                            a scheduler of budget B, cap S, pool of K blocks;
//	                                            with itl, an ITL target of T ms (Kx: K times
//	                                            the step's decodes alone) over a cost
//	                                            model of A ms + B ms a prefill token and C ms
//	                                            + D ms a decoding sequence (steps then print
//	                                            their predicted time)
//	                                            (with host=H, a host tier of H blocks, bytes
//	                                            modelled)
//	add id=I prompt=P out=O [prio=R] [prefix=J:L]
//	                                            a sequence of P prompt tokens (the first L
//	                                            of them sequence J's) that generates O tokens
//	step [n=K]                                  K steps; each prints its plan (Plan.String)
//	                                            and the sequences that finished
//	run                                         steps until nothing waits or runs
//	finish id=I                                 the caller finishes I (a stop token, a client gone)
//	state                                       the waiting and running sequences, as
//	                                            ID(tokens with KV/tokens)
//	census                                      the Census and the load report it makes
//	loads id=I                                  an onboarding sequence's loads, as tier:slot→block
//	onboarded id=I ok=K [bad]                   the caller reports I's loads: K done (then a bad one)
//
// With micro=D on new (Config.MicroBatches), steps go in flight and land later:
//
//	launch                                      plan a step and put it in flight
//	land                                        land the oldest step in flight and sample it
//	pipe [n=K]                                  K turns of a pipeline of D stages: land the
//	                                            oldest step when D are in flight, then launch;
//	                                            when nothing launches, land the oldest
func TestScripts(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts in testdata (%v)", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) {
			var h *harness
			datadriven.RunFile(t, f, func(t *testing.T, d *datadriven.TestData) string {
				if d.Cmd != "new" && h == nil {
					t.Fatalf("%s: %s before new", d.Pos, d.Cmd)
				}
				var out string
				switch d.Cmd {
				case "new":
					h = newHarness(t, d)
				case "add":
					out = h.add(t, d)
				case "step":
					out = h.step(d.Int(t, "n", 1))
				case "run":
					out = h.run(t)
				case "finish":
					q := h.seq(t, d, d.Int(t, "id", 0))
					h.s.Finish(q)
					out = h.state()
				case "state":
					out = h.state()
				case "census":
					out = h.census()
				case "launch":
					out = h.launch()
				case "land":
					out = h.land(t)
				case "pipe":
					for range d.Int(t, "n", 1) {
						if len(h.flight) == max(h.s.cfg.MicroBatches, 1) {
							out += h.land(t)
						}
						before := len(h.flight)
						out += h.launch()
						if len(h.flight) == before && before > 0 {
							out += h.land(t) // nothing to launch: wait for the oldest
						}
					}
				case "loads":
					out = h.loads(h.seq(t, d, d.Int(t, "id", 0)))
				case "onboarded":
					q := h.seq(t, d, d.Int(t, "id", 0))
					if ok := d.Int(t, "ok", 0); ok > len(q.Loads()) || !q.Onboarding() {
						out = fmt.Sprintf("error: %d loads done of %d (onboarding %v)\n", ok, len(q.Loads()), q.Onboarding())
						d.Has("bad")
						break
					}
					h.s.Onboarded(q, d.Int(t, "ok", 0), d.Has("bad"))
					out = h.state()
				default:
					t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
				}
				d.CheckArgs(t)
				return out
			})
		})
	}
}

// linearCost is a test's step cost in ms: a base, a cost per prompt token and one per
// Σ nᵢ·ctxᵢ for the prefill part, a base and a cost per sequence for the decode part.
type linearCost struct{ prefillBase, perToken, perQuad, decodeBase, perSeq float64 }

func (c linearCost) Step(s StepShape) time.Duration {
	ms := 0.0
	if s.PrefillTokens > 0 {
		ms += c.prefillBase + c.perToken*float64(s.PrefillTokens) + c.perQuad*s.PrefillQuad
	}
	if s.DecodeSeqs > 0 {
		ms += c.decodeBase + c.perSeq*float64(s.DecodeSeqs)
	}
	return time.Duration(ms * float64(time.Millisecond))
}

// pair parses "A+B" as two numbers.
func pair(t *testing.T, d *datadriven.TestData, key string) (float64, float64) {
	a, b, ok := strings.Cut(d.Str(key, "0+0"), "+")
	x, err1 := strconv.ParseFloat(a, 64)
	y, err2 := strconv.ParseFloat(b, 64)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("%s: %s=%q, want A+B", d.Pos, key, d.Str(key, ""))
	}
	return x, y
}

func newHarness(t *testing.T, d *datadriven.TestData) *harness {
	pool := kvcache.NewPool(d.Int(t, "blocks", 64), d.Int(t, "block-size", 4))
	if host := d.Int(t, "host", 0); host > 0 {
		var err error
		pool, err = kvcache.NewPoolWith(d.Int(t, "blocks", 64), d.Int(t, "block-size", 4), kvcache.Options{Tiers: []kvcache.TierConfig{{Tier: kvcache.TierHost, Blocks: host}}})
		if err != nil {
			t.Fatalf("%s: %v", d.Pos, err)
		}
	}
	cfg := Config{MaxBatchTokens: d.Int(t, "budget", 16), MaxSeqs: d.Int(t, "seqs", 8), Salt: 7, MicroBatches: d.Int(t, "micro", 0)}
	if d.Has("itl") {
		var c linearCost
		c.prefillBase, c.perToken = pair(t, d, "prefill")
		c.decodeBase, c.perSeq = pair(t, d, "decode")
		cfg.Cost = c
		if k, ok := strings.CutSuffix(d.Str("itl", ""), "x"); ok {
			f, err := strconv.ParseFloat(k, 64)
			if err != nil {
				t.Fatalf("%s: itl=%sx", d.Pos, k)
			}
			cfg.ITLDecodes = f
		} else {
			cfg.ITLTarget = time.Duration(d.Int(t, "itl", 0)) * time.Millisecond
		}
	}
	s, err := New[*testSeq](cfg, pool)
	if err != nil {
		t.Fatalf("%s: %v", d.Pos, err)
	}
	return &harness{pool: pool, s: s, seqs: map[uint64]*testSeq{}}
}

func (h *harness) seq(t *testing.T, d *datadriven.TestData, id int) *testSeq {
	q := h.seqs[uint64(id)]
	if q == nil {
		t.Fatalf("%s: no sequence %d", d.Pos, id)
	}
	return q
}

// token is the id at position pos of sequence id's prompt (gen false) or output.
func token(id uint64, pos int, gen bool) int32 {
	x := id<<32 | uint64(pos)
	if gen {
		x ^= 0x5eed << 48
	}
	return int32(splitmix(x) & 0x7fffffff)
}

func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func (h *harness) add(t *testing.T, d *datadriven.TestData) string {
	id := uint64(d.Int(t, "id", 0))
	if id == 0 || h.seqs[id] != nil {
		t.Fatalf("%s: add needs a new id", d.Pos)
	}
	q := &testSeq{Seq: Seq{ID: id, Priority: d.Int(t, "prio", 0), PromptLen: d.Int(t, "prompt", 0)}, out: d.Int(t, "out", 1)}
	var from *testSeq
	shared := 0
	if p := d.Str("prefix", ""); p != "" {
		j, l, _ := strings.Cut(p, ":")
		jj, err1 := strconv.Atoi(j)
		ll, err2 := strconv.Atoi(l)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: prefix=%q, want ID:LEN", d.Pos, p)
		}
		from, shared = h.seq(t, d, jj), ll
		if shared > from.PromptLen || shared > q.PromptLen {
			t.Fatalf("%s: prefix of %d tokens is longer than a prompt", d.Pos, shared)
		}
	}
	for p := range q.PromptLen {
		if p < shared {
			q.Tokens = append(q.Tokens, from.Tokens[p])
		} else {
			q.Tokens = append(q.Tokens, token(id, p, false))
		}
	}
	h.seqs[id] = q
	h.s.Add(q)
	return h.state()
}

// step runs n steps: plan, forward pass (nothing), commit, sample.
func (h *harness) step(n int) string {
	var b strings.Builder
	for range n {
		h.steps++
		p := h.s.Schedule()
		if h.s.Config().Cost != nil {
			fmt.Fprintf(&b, "step %d: %s (%v)\n", h.steps, p, p.Predicted)
		} else {
			fmt.Fprintf(&b, "step %d: %s\n", h.steps, p)
		}
		h.s.Commit()
		b.WriteString(h.sample(p.Chunks))
	}
	return b.String()
}

// sample appends a token to each chunk's sequence that the step ends, and finishes those
// done; it returns the "done" line.
func (h *harness) sample(chunks []Chunk[*testSeq]) string {
	var done []string
	for _, c := range chunks {
		if !c.Samples() || !c.Seq.Running() {
			continue
		}
		q := c.Seq
		q.Tokens = append(q.Tokens, token(q.ID, len(q.Tokens), true))
		if q.Generated() >= q.out {
			h.s.Finish(q)
			done = append(done, strconv.FormatUint(q.ID, 10))
		}
	}
	if len(done) == 0 {
		return ""
	}
	return "  done " + strings.Join(done, " ") + "\n"
}

// launch plans a step and puts it in flight.
func (h *harness) launch() string {
	h.steps++
	p := h.s.Schedule()
	if len(p.Chunks) > 0 {
		h.flight = append(h.flight, slices.Clone(p.Chunks))
		h.flightID = append(h.flightID, h.steps)
	}
	return fmt.Sprintf("launch %d: %s\n", h.steps, p)
}

// land lands the oldest step in flight and samples it.
func (h *harness) land(t *testing.T) string {
	if len(h.flight) == 0 {
		return "land: nothing in flight\n"
	}
	chunks, id := h.flight[0], h.flightID[0]
	h.flight, h.flightID = h.flight[1:], h.flightID[1:]
	h.s.Land(chunks)
	return fmt.Sprintf("land %d\n", id) + h.sample(chunks)
}

func (h *harness) run(t *testing.T) string {
	var b strings.Builder
	for i := 0; !h.s.Idle(); i++ {
		if i == 1000 {
			t.Fatalf("not idle after 1000 steps:\n%s", b.String())
		}
		b.WriteString(h.step(1))
		if len(h.s.plan.Chunks) == 0 && !h.s.Idle() {
			b.WriteString("stuck\n")
			break
		}
	}
	return b.String()
}

func (h *harness) state() string {
	list := func(qs []*testSeq) string {
		var parts []string
		for _, q := range qs {
			kv := 0
			if q.KV != nil {
				kv = q.KV.Len()
			}
			parts = append(parts, fmt.Sprintf("%d(%d/%d)", q.ID, kv, len(q.Tokens)))
		}
		if len(parts) == 0 {
			return "-"
		}
		return strings.Join(parts, " ")
	}
	out := "waiting " + list(h.s.Waiting()) + "; running " + list(h.s.Running())
	if len(h.s.Onboarding()) > 0 {
		out += "; onboarding " + list(h.s.Onboarding())
	}
	return out
}

func (h *harness) loads(q *testSeq) string {
	var parts []string
	for _, l := range q.Loads() {
		parts = append(parts, fmt.Sprintf("%v:%d→%d", l.From.Tier, l.From.Slot, l.Block))
	}
	return strings.Join(parts, " ") + "\n"
}

// A random workload keeps the scheduler's promises: every step stays within the budget and
// the sequence cap, a sequence is never in a plan twice, decode tokens come before prefill
// chunks of running sequences (those by priority, then fewest tokens left), a step with
// decode tokens stays within the ITL target's limit, every sequence finishes with all its
// tokens, and at the end no block is in use. Odd seeds schedule with an ITL target; seeds
// that are 1 mod 3 have a host tier (sequences onboard, their loads ending at random).
func TestRandomWorkload(t *testing.T) {
	onboarded := 0 // loads reported, over the seeds with a host tier
	defer func() {
		if onboarded == 0 {
			t.Error("no sequence onboarded")
		}
	}()
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 1))
		budget, maxSeqs := 1+rng.IntN(64), 1+rng.IntN(8)
		bs := 1 + rng.IntN(8)
		pool := kvcache.NewPool(8+rng.IntN(64), bs)
		cfg := Config{MaxBatchTokens: budget, MaxSeqs: maxSeqs}
		if seed%2 == 1 {
			cfg.Cost = linearCost{prefillBase: rng.Float64() * 5, perToken: rng.Float64(), perQuad: rng.Float64() / 1000, decodeBase: rng.Float64() * 10, perSeq: rng.Float64() * 3}
			if seed%4 == 1 {
				cfg.ITLTarget = time.Duration(5+rng.IntN(40)) * time.Millisecond
			} else {
				cfg.ITLDecodes = 1 + 4*rng.Float64()
			}
		}
		if seed%3 == 1 { // with a host tier: sequences onboard, and their loads end at random
			var err error
			pool, err = kvcache.NewPoolWith(pool.NumBlocks(), bs, kvcache.Options{Tiers: []kvcache.TierConfig{{Tier: kvcache.TierHost, Blocks: 4 + rng.IntN(64)}}})
			if err != nil {
				t.Fatal(err)
			}
		}
		s, err := New[*testSeq](cfg, pool)
		if err != nil {
			t.Fatal(err)
		}
		var all []*testSeq
		finished := map[*testSeq]bool{}
		for step := 0; step < 5000 && (len(all) < 40 || !s.Idle()); step++ {
			if len(all) < 40 && rng.IntN(3) == 0 {
				id := uint64(len(all) + 1)
				room := pool.NumBlocks() * bs // ≥ 8
				q := &testSeq{Seq: Seq{ID: id, Priority: rng.IntN(3)}, out: 1 + rng.IntN(min(20, room/2))}
				n := 1 + rng.IntN(min(60, room-q.out-1)) // so that s.Fits(n + out): nothing is dropped
				group, shared := uint64(100+rng.IntN(3)), rng.IntN(n+1)
				for p := range n {
					if p < shared { // sequences of a group share a prefix
						q.Tokens = append(q.Tokens, token(group, p, false))
					} else {
						q.Tokens = append(q.Tokens, token(id, p, false))
					}
				}
				q.PromptLen = n
				all = append(all, q)
				s.Add(q)
			}
			p := s.Schedule()
			total, seen, last, prompt := 0, map[*testSeq]bool{}, (*testSeq)(nil), 0
			var running, singles StepShape
			for _, c := range p.Chunks {
				if seen[c.Seq] || c.N < 1 || c.From != c.Seq.KV.Len() || !c.Seq.Running() {
					t.Fatalf("seed %d: bad chunk %+v (twice %v, KV %d)", seed, c, seen[c.Seq], c.Seq.KV.Len())
				}
				seen[c.Seq] = true
				total += c.N
				started := slices.Contains(p.Admitted, c.Seq) || slices.Contains(p.Resumed, c.Seq)
				if c.N > 1 || c.From+1 < len(c.Seq.Tokens) {
					prompt += c.N // a prompt chunk, possibly cut to one token
				} else {
					// The target is set from the last tokens planned before the first
					// prompt asks for time: the running ones at least, all at most.
					if !started {
						running.Add(1, c.From+1)
					}
					singles.Add(1, c.From+1)
				}
				if started {
					continue
				}
				// Running sequences: one token left first (decodes), then prompts by priority,
				// then fewest tokens left.
				if last != nil && runOrder(c.Seq, last) < 0 {
					t.Fatalf("seed %d: sequence %d's chunk after %d's: %s", seed, c.Seq.ID, last.ID, p)
				}
				last = c.Seq
			}
			if cfg.Cost != nil {
				if p.Predicted != cfg.Cost.Step(p.Shape) {
					t.Fatalf("seed %d: predicted %v, the cost model says %v", seed, p.Predicted, cfg.Cost.Step(p.Shape))
				}
				// Decodes are never cut; prompts fill a step up to the target (or twice the
				// decodes' time), or read a step's minimum past it.
				lo, hi := cfg.ITLTarget, cfg.ITLTarget
				if k := cfg.ITLDecodes; k > 0 {
					lo = max(time.Duration(k*float64(cfg.Cost.Step(running))), 1)
					hi = max(time.Duration(k*float64(cfg.Cost.Step(singles))), 1)
				}
				if p.streaming && (p.Target < lo || p.Target > hi) {
					t.Fatalf("seed %d: target %v, want %v to %v: %s", seed, p.Target, lo, hi, p)
				}
				limit := max(p.Target, overloadFactor*cfg.Cost.Step(singles))
				if p.streaming && p.Predicted > limit && prompt > cfg.minPrompt() {
					t.Fatalf("seed %d: predicted %v past the limit %v with %d prompt tokens: %s", seed, p.Predicted, limit, prompt, p)
				}
				if p.OverTarget != (p.streaming && p.Predicted > p.Target) {
					t.Fatalf("seed %d: over target %v at %v of %v: %s", seed, p.OverTarget, p.Predicted, p.Target, p)
				}
			}
			if total > budget || len(s.Running())+len(s.Onboarding()) > maxSeqs {
				t.Fatalf("seed %d: %d tokens of %d, %d running of %d", seed, total, budget, len(s.Running()), maxSeqs)
			}
			if len(p.Dropped) > 0 {
				t.Fatalf("seed %d: dropped %v although every sequence fits the pool", seed, p)
			}
			s.Commit()
			for _, c := range p.Chunks {
				if c.Samples() {
					q := c.Seq
					q.Tokens = append(q.Tokens, token(q.ID, len(q.Tokens), true))
					if q.Generated() == q.out {
						s.Finish(q)
						finished[q] = true
					}
				}
			}
			for _, q := range slices.Clone(s.Onboarding()) {
				if rng.IntN(3) == 0 {
					n := len(q.Loads())
					ok := rng.IntN(n + 1)
					s.Onboarded(q, ok, ok < n && rng.IntN(2) == 0)
					onboarded++
				}
			}
		}
		if len(finished) != len(all) {
			t.Fatalf("seed %d: %d of %d finished", seed, len(finished), len(all))
		}
		if st := pool.Stats(); st.Used != 0 {
			t.Fatalf("seed %d: %d blocks still used", seed, st.Used)
		}
	}
}

// In a steady decode, a step (plan, commit, finish of the sequences that end) allocates
// nothing, with an ITL target over a live cost model (observed each step) too.
func TestScheduleAllocatesNothing(t *testing.T) {
	for _, timed := range []bool{false, true} {
		pool := kvcache.NewPool(64, 256) // one block each: no block table grows
		cfg := Config{MaxBatchTokens: 128, MaxSeqs: 9}
		var live *LiveCost
		if timed {
			live = NewLiveCost(linearCost{prefillBase: 5, perToken: 1, decodeBase: 10, perSeq: 1})
			cfg.Cost, cfg.ITLTarget = live, 30*time.Millisecond
		}
		s, err := New[*testSeq](cfg, pool)
		if err != nil {
			t.Fatal(err)
		}
		var qs []*testSeq
		for i := range 8 {
			q := &testSeq{Seq: Seq{ID: uint64(i + 1), PromptLen: 10, Tokens: make([]int32, 10, 250)}, out: 1 << 30}
			for p := range q.Tokens {
				q.Tokens[p] = token(q.ID, p, false)
			}
			qs = append(qs, q)
			s.Add(q)
		}
		step := func() {
			p := s.Schedule()
			s.Commit()
			if live != nil {
				live.Observe(p.Shape, 20*time.Millisecond)
			}
			for _, c := range p.Chunks {
				if c.Samples() {
					c.Seq.Tokens = append(c.Seq.Tokens, 1)
				}
			}
		}
		step() // the prefills
		if timed {
			// A long prompt read in chunks under the target, beside the decodes.
			q := &testSeq{Seq: Seq{ID: 9, PromptLen: 200, Tokens: make([]int32, 200, 250)}, out: 1 << 30}
			for p := range q.Tokens {
				q.Tokens[p] = token(q.ID, p, false)
			}
			qs = append(qs, q)
			s.Add(q)
			step() // its admission (grows the running list)
		}
		if n := testing.AllocsPerRun(100, step); n != 0 {
			t.Errorf("timed %v: %v allocations per step", timed, n)
		}
		want := 102 // the prefill step and 101 decodes
		if timed {
			want++ // the long prompt's first step
		}
		for _, q := range qs[:8] {
			if !q.Running() || q.Generated() != want {
				t.Fatalf("timed %v: sequence %d: running %v, %d generated", timed, q.ID, q.Running(), q.Generated())
			}
		}
		for _, q := range qs {
			s.Finish(q)
		}
		if !s.Idle() || pool.Stats().Used != 0 {
			t.Errorf("after Finish: idle %v, %d blocks used", s.Idle(), pool.Stats().Used)
		}
	}
}

func (h *harness) census() string {
	c := h.s.Census()
	l := c.Load(h.pool.Stats())
	out := fmt.Sprintf("running %d prefilling %d waiting %d prefill-tokens %d waiting-tokens %d decode-blocks %d\n"+
		"report: running %d waiting %d prefill-tokens %d queued %d queued-tokens %d decode-blocks %d cached-blocks %d\n",
		c.Running, c.Prefilling, c.Waiting, c.PrefillTokens, c.WaitingTokens, c.DecodeBlocks,
		l.Running, l.Waiting, l.PrefillTokens, l.Queued, l.QueuedTokens, l.DecodeBlocks, l.CachedBlocks)
	if c.Onboarding > 0 {
		out += fmt.Sprintf("onboarding %d\n", c.Onboarding)
	}
	return out
}
