package sched

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

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
}

// TestScripts runs the scripts in testdata. Commands:
//
//	new budget=B seqs=S blocks=K block-size=N [host=H]
//	                                            a scheduler of budget B, cap S, pool of K blocks
//	                                            (and a host tier of H blocks, bytes modelled)
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

func newHarness(t *testing.T, d *datadriven.TestData) *harness {
	pool := kvcache.NewPool(d.Int(t, "blocks", 64), d.Int(t, "block-size", 4))
	if host := d.Int(t, "host", 0); host > 0 {
		var err error
		pool, err = kvcache.NewPoolWith(d.Int(t, "blocks", 64), d.Int(t, "block-size", 4), kvcache.Options{Tiers: []kvcache.TierConfig{{Tier: kvcache.TierHost, Blocks: host}}})
		if err != nil {
			t.Fatalf("%s: %v", d.Pos, err)
		}
	}
	s, err := New[*testSeq](Config{MaxBatchTokens: d.Int(t, "budget", 16), MaxSeqs: d.Int(t, "seqs", 8), Salt: 7}, pool)
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
		fmt.Fprintf(&b, "step %d: %s\n", h.steps, p)
		h.s.Commit()
		var done []string
		for _, c := range p.Chunks {
			if !c.Samples() {
				continue
			}
			q := c.Seq
			q.Tokens = append(q.Tokens, token(q.ID, len(q.Tokens), true))
			if q.Generated() >= q.out {
				h.s.Finish(q)
				done = append(done, strconv.FormatUint(q.ID, 10))
			}
		}
		if len(done) > 0 {
			fmt.Fprintf(&b, "  done %s\n", strings.Join(done, " "))
		}
	}
	return b.String()
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
// chunks of running sequences, every sequence finishes with all its tokens, and at the end
// no block is in use.
func TestRandomWorkload(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		budget, maxSeqs := 1+rng.IntN(64), 1+rng.IntN(8)
		bs := 1 + rng.IntN(8)
		pool := kvcache.NewPool(8+rng.IntN(64), bs)
		if seed%2 == 1 { // with a host tier: sequences onboard, and their loads end at random
			var err error
			pool, err = kvcache.NewPoolWith(pool.NumBlocks(), bs, kvcache.Options{Tiers: []kvcache.TierConfig{{Tier: kvcache.TierHost, Blocks: 4 + rng.IntN(64)}}})
			if err != nil {
				t.Fatal(err)
			}
		}
		s, err := New[*testSeq](Config{MaxBatchTokens: budget, MaxSeqs: maxSeqs}, pool)
		if err != nil {
			t.Fatal(err)
		}
		var all []*testSeq
		finished := map[*testSeq]bool{}
		onboarded := 0
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
			total, seen, lastLeft := 0, map[*testSeq]bool{}, 0
			for _, c := range p.Chunks {
				if seen[c.Seq] || c.N < 1 || c.From != c.Seq.KV.Len() || !c.Seq.Running() {
					t.Fatalf("seed %d: bad chunk %+v (twice %v, KV %d)", seed, c, seen[c.Seq], c.Seq.KV.Len())
				}
				seen[c.Seq] = true
				total += c.N
				if slices.Contains(p.Admitted, c.Seq) || slices.Contains(p.Resumed, c.Seq) {
					continue
				}
				// Running sequences go fewest tokens left first: decodes before prefill chunks.
				if l := len(c.Seq.Tokens) - c.From; l < lastLeft {
					t.Fatalf("seed %d: a chunk with %d tokens left after one with %d: %s", seed, l, lastLeft, p)
				} else {
					lastLeft = l
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
		if seed%2 == 1 && onboarded == 0 {
			t.Errorf("seed %d: nothing onboarded", seed)
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
// nothing.
func TestScheduleAllocatesNothing(t *testing.T) {
	pool := kvcache.NewPool(64, 256) // one block each: no block table grows
	s, err := New[*testSeq](Config{MaxBatchTokens: 128, MaxSeqs: 8}, pool)
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
		for _, c := range p.Chunks {
			if c.Samples() {
				c.Seq.Tokens = append(c.Seq.Tokens, 1)
			}
		}
	}
	step() // the prefills
	if n := testing.AllocsPerRun(100, step); n != 0 {
		t.Errorf("%v allocations per decode step", n)
	}
	for _, q := range qs {
		if !q.Running() || q.Generated() != 102 {
			t.Fatalf("sequence %d: running %v, %d generated", q.ID, q.Running(), q.Generated())
		}
		s.Finish(q)
	}
	if !s.Idle() || pool.Stats().Used != 0 {
		t.Errorf("after Finish: idle %v, %d blocks used", s.Idle(), pool.Stats().Used)
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
