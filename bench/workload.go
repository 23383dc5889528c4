package bench

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"time"
)

// A Segment is a run of synthetic prompt tokens: the first Len tokens of the
// endless pseudo-random sequence named by Seed. Equal seeds give equal
// tokens, so workloads share prefixes by sharing segments, and prompts stay
// small until they are sent.
type Segment struct {
	Seed uint64
	Len  int
}

// Tokens appends the segment's abstract token ids to dst. Abstract ids are
// mapped to a server's vocabulary (or to words) by a Renderer.
func (s Segment) Tokens(dst []uint32) []uint32 {
	for i := range s.Len {
		dst = append(dst, uint32(splitmix64(s.Seed+uint64(i)*0x9e3779b97f4a7c15)>>32))
	}
	return dst
}

// Request is one request of a workload, before it is rendered for an
// endpoint. A request's prompt is either synthetic (Segments) or literal text
// (Text).
type Request struct {
	Segments  []Segment // synthetic prompt, in order
	Text      string    // literal prompt, used when Segments is empty
	OutputLen int       // max_tokens
}

// InputLen is the request's intended prompt length in tokens: exact for
// synthetic prompts sent as token ids, 0 for literal text.
func (r *Request) InputLen() int {
	n := 0
	for _, s := range r.Segments {
		n += s.Len
	}
	return n
}

// Session is a sequence of requests that depend on each other: turn i+1 is
// sent Think after turn i ends, with the conversation so far (every earlier
// prompt and the server's answers) before its own prompt. Single-turn
// workloads have sessions of one request.
type Session struct {
	At    time.Duration // the first turn's trace timestamp (workloads with Timed)
	Turns []Request
	Think time.Duration
}

// Workload is a load-test workload: a fixed list of sessions, generated from
// a seed so that runs repeat.
type Workload interface {
	Name() string
	Sessions() []Session
	// Timed reports whether the sessions carry trace timestamps (At), which
	// the "trace" arrival process replays.
	Timed() bool
}

type workload struct {
	name     string
	sessions []Session
	timed    bool
}

func (w *workload) Name() string        { return w.name }
func (w *workload) Sessions() []Session { return w.sessions }
func (w *workload) Timed() bool         { return w.timed }

func single(name string, reqs []Request) *workload {
	w := &workload{name: name, sessions: make([]Session, len(reqs))}
	for i, r := range reqs {
		w.sessions[i] = Session{Turns: []Request{r}}
	}
	return w
}

// seeder hands out distinct segment seeds derived from a run seed.
type seeder struct{ base, n uint64 }

func newSeeder(seed int64, kind string) *seeder {
	h := uint64(seed)
	for _, c := range kind {
		h = splitmix64(h ^ uint64(c))
	}
	return &seeder{base: h}
}

func (s *seeder) next() uint64 {
	s.n++
	return splitmix64(s.base ^ splitmix64(s.n))
}

// lengthIn draws a length uniformly from [n·(1−ratio), n·(1+ratio)], at
// least 1, as vLLM's random dataset does with its range ratio.
func lengthIn(r *rand.Rand, n int, ratio float64) int {
	if ratio <= 0 || n <= 0 {
		return max(n, 1)
	}
	lo := max(int(float64(n)*(1-ratio)), 1)
	hi := max(int(float64(n)*(1+ratio)), lo)
	return lo + r.IntN(hi-lo+1)
}

// RandomOptions shape the random workload (vLLM's "random" dataset).
type RandomOptions struct {
	N          int     // requests
	InputLen   int     // mean prompt length in tokens, after PrefixLen
	OutputLen  int     // mean output length
	RangeRatio float64 // lengths are uniform in [len·(1−r), len·(1+r)]
	PrefixLen  int     // tokens every prompt starts with (0: none)
	Seed       int64
}

// Random returns prompts of random tokens with lengths drawn around the
// given means.
func Random(o RandomOptions) (Workload, error) {
	if o.N <= 0 || o.InputLen <= 0 || o.OutputLen <= 0 {
		return nil, fmt.Errorf("bench: random workload wants positive count and lengths, got n=%d input=%d output=%d", o.N, o.InputLen, o.OutputLen)
	}
	if o.RangeRatio < 0 || o.RangeRatio >= 1 {
		return nil, fmt.Errorf("bench: range ratio %v outside [0, 1)", o.RangeRatio)
	}
	r := rand.New(rand.NewPCG(uint64(o.Seed), 1))
	sd := newSeeder(o.Seed, "random")
	prefix := Segment{Seed: sd.next(), Len: o.PrefixLen}
	reqs := make([]Request, o.N)
	for i := range reqs {
		var segs []Segment
		if o.PrefixLen > 0 {
			segs = append(segs, prefix)
		}
		segs = append(segs, Segment{Seed: sd.next(), Len: lengthIn(r, o.InputLen, o.RangeRatio)})
		reqs[i] = Request{Segments: segs, OutputLen: lengthIn(r, o.OutputLen, o.RangeRatio)}
	}
	return single("random", reqs), nil
}

// SharedPrefixOptions shape the shared-prefix workload (SGLang's
// generated-shared-prefix): Groups system prompts, each followed by
// PromptsPerGroup different questions.
type SharedPrefixOptions struct {
	Groups          int // default 64
	PromptsPerGroup int // default 16
	SystemLen       int // default 2048
	QuestionLen     int // default 128
	OutputLen       int // default 256
	N               int // requests; 0: Groups × PromptsPerGroup (cycled past that)
	Seed            int64
}

// SharedPrefix returns Groups×PromptsPerGroup prompts, each a group's system
// prompt and a question of its own, in a seeded shuffled order.
func SharedPrefix(o SharedPrefixOptions) (Workload, error) {
	setDefault(&o.Groups, 64)
	setDefault(&o.PromptsPerGroup, 16)
	setDefault(&o.SystemLen, 2048)
	setDefault(&o.QuestionLen, 128)
	setDefault(&o.OutputLen, 256)
	if o.Groups < 0 || o.PromptsPerGroup < 0 || o.SystemLen < 0 || o.QuestionLen < 0 || o.OutputLen < 0 || o.N < 0 {
		return nil, fmt.Errorf("bench: shared-prefix options must not be negative: %+v", o)
	}
	sd := newSeeder(o.Seed, "shared-prefix")
	var reqs []Request
	for range o.Groups {
		sys := Segment{Seed: sd.next(), Len: o.SystemLen}
		for range o.PromptsPerGroup {
			reqs = append(reqs, Request{Segments: []Segment{sys, {Seed: sd.next(), Len: o.QuestionLen}}, OutputLen: o.OutputLen})
		}
	}
	r := rand.New(rand.NewPCG(uint64(o.Seed), 2))
	r.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	return single("shared-prefix", cycle(reqs, o.N)), nil
}

// MultiTurnOptions shape the multi-turn workload: Conversations sessions of
// Turns turns; each turn adds a user message of about InputLen tokens and
// asks for OutputLen tokens, and sends the whole conversation so far.
type MultiTurnOptions struct {
	Conversations int
	Turns         int
	SystemLen     int // a system prompt per conversation (0: none)
	InputLen      int
	OutputLen     int
	RangeRatio    float64
	Think         time.Duration // pause between an answer and the next turn
	Seed          int64
}

// MultiTurn returns conversations that grow their context turn by turn.
func MultiTurn(o MultiTurnOptions) (Workload, error) {
	if o.Conversations <= 0 || o.Turns <= 0 || o.InputLen <= 0 || o.OutputLen <= 0 || o.SystemLen < 0 {
		return nil, fmt.Errorf("bench: multi-turn workload wants positive conversations, turns and lengths: %+v", o)
	}
	if o.RangeRatio < 0 || o.RangeRatio >= 1 {
		return nil, fmt.Errorf("bench: range ratio %v outside [0, 1)", o.RangeRatio)
	}
	r := rand.New(rand.NewPCG(uint64(o.Seed), 3))
	sd := newSeeder(o.Seed, "multi-turn")
	w := &workload{name: "multi-turn"}
	for range o.Conversations {
		s := Session{Think: o.Think}
		for t := range o.Turns {
			var segs []Segment
			if t == 0 && o.SystemLen > 0 {
				segs = append(segs, Segment{Seed: sd.next(), Len: o.SystemLen})
			}
			segs = append(segs, Segment{Seed: sd.next(), Len: lengthIn(r, o.InputLen, o.RangeRatio)})
			s.Turns = append(s.Turns, Request{Segments: segs, OutputLen: lengthIn(r, o.OutputLen, o.RangeRatio)})
		}
		w.sessions = append(w.sessions, s)
	}
	return w, nil
}

// ShareGPT returns n prompts (0: all) of the dataset in a seeded shuffled
// order, cycled if n is larger, each asking for outputLen tokens.
func ShareGPT(prompts []string, n, outputLen int, seed int64) (Workload, error) {
	if len(prompts) == 0 {
		return nil, fmt.Errorf("bench: the ShareGPT dataset has no prompts")
	}
	if outputLen <= 0 {
		return nil, fmt.Errorf("bench: ShareGPT output length must be positive, got %d", outputLen)
	}
	reqs := make([]Request, len(prompts))
	for i, p := range prompts {
		reqs[i] = Request{Text: p, OutputLen: outputLen}
	}
	r := rand.New(rand.NewPCG(uint64(seed), 4))
	r.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
	return single("sharegpt", cycle(reqs, n)), nil
}

// MooncakeBlockSize is the number of tokens a Mooncake trace's hash id
// stands for.
const MooncakeBlockSize = 512

// MooncakeOptions shape a Mooncake trace replay.
type MooncakeOptions struct {
	N int // keep the first N rows (0: all)
	// BlockSize is the replay's tokens per hash id; 0 → MooncakeBlockSize.
	// A smaller size scales every prompt down by BlockSize/512 and keeps the
	// trace's block structure (for models with short contexts).
	BlockSize    int
	MaxOutputLen int // caps output lengths (0: the trace's)
	Seed         int64
}

// Mooncake replays a Mooncake trace: each row becomes a request at its
// timestamp whose prompt is one segment per hash id, BlockSize tokens each
// (the last one cut to the row's input length, scaled). Equal hash ids give
// equal token blocks, so the trace's prefix reuse is kept.
func Mooncake(rows []TraceRow, o MooncakeOptions) (Workload, error) {
	bs := cmp.Or(o.BlockSize, MooncakeBlockSize)
	if bs <= 0 || o.MaxOutputLen < 0 || o.N < 0 {
		return nil, fmt.Errorf("bench: bad Mooncake options %+v", o)
	}
	if o.N > 0 && o.N < len(rows) {
		rows = rows[:o.N]
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("bench: the trace has no rows")
	}
	base := newSeeder(o.Seed, "mooncake").base
	w := &workload{name: "mooncake", timed: true}
	t0 := rows[0].Timestamp
	for i, row := range rows {
		if need := (row.InputLength + MooncakeBlockSize - 1) / MooncakeBlockSize; len(row.HashIDs) < need {
			return nil, fmt.Errorf("bench: trace row %d: %d hash ids cover %d tokens, not input_length %d", i+1, len(row.HashIDs), len(row.HashIDs)*MooncakeBlockSize, row.InputLength)
		}
		segs := make([]Segment, 0, len(row.HashIDs))
		for b, h := range row.HashIDs {
			left := row.InputLength - b*MooncakeBlockSize
			if left <= 0 {
				break
			}
			n := bs
			if left < MooncakeBlockSize {
				n = max((left*bs+MooncakeBlockSize-1)/MooncakeBlockSize, 1)
			}
			segs = append(segs, Segment{Seed: splitmix64(base ^ splitmix64(uint64(h))), Len: n})
		}
		out := max(row.OutputLength, 1)
		if o.MaxOutputLen > 0 {
			out = min(out, o.MaxOutputLen)
		}
		w.sessions = append(w.sessions, Session{
			At:    time.Duration(row.Timestamp-t0) * time.Millisecond,
			Turns: []Request{{Segments: segs, OutputLen: out}},
		})
	}
	return w, nil
}

func cycle(reqs []Request, n int) []Request {
	if n <= 0 || len(reqs) == 0 {
		return reqs
	}
	out := make([]Request, n)
	for i := range out {
		out[i] = reqs[i%len(reqs)]
	}
	return out
}

func setDefault(p *int, v int) {
	if *p == 0 {
		*p = v
	}
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
