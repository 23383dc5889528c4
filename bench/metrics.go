package bench

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Timeline is what the client records of one streamed request; metrics are
// pure functions of it.
type Timeline struct {
	Sent   time.Time   // just before the request was written
	Chunks []time.Time // arrival of each SSE event that carried content
	End    time.Time   // the stream's end ([DONE] or EOF)
	// From the server's usage; -1 when it sent none.
	PromptTokens, CompletionTokens, CachedTokens int

	Err string // non-empty when the request failed
}

// NewTimeline returns a timeline with no usage seen.
func NewTimeline() *Timeline {
	return &Timeline{PromptTokens: -1, CompletionTokens: -1, CachedTokens: -1}
}

// RequestResult is one request's measurements. Durations are from the
// benchmark's start (Start) or from the request's send time.
type RequestResult struct {
	Session, Turn int
	Start         time.Duration   // when it was sent
	TTFT          time.Duration   // sent → first content chunk
	ITL           []time.Duration // gaps between successive content chunks
	E2E           time.Duration   // sent → last content chunk (stream end if none)
	InputLen      int             // usage.prompt_tokens, else the intended length
	OutputLen     int             // usage.completion_tokens, else content chunks
	CachedTokens  int             // usage.prompt_tokens_details.cached_tokens (0 if absent)
	Err           string
}

// OK reports whether the request succeeded.
func (r *RequestResult) OK() bool { return r.Err == "" }

// TPOT is (E2E − TTFT)/(OutputLen − 1), the mean time per output token after
// the first; 0 for requests with fewer than two output tokens.
func (r *RequestResult) TPOT() time.Duration {
	if r.OutputLen < 2 {
		return 0
	}
	return (r.E2E - r.TTFT) / time.Duration(r.OutputLen-1)
}

// End is when the request finished, from the benchmark's start.
func (r *RequestResult) End() time.Duration { return r.Start + r.E2E }

// Result turns a timeline into a request's measurements, with vLLM's
// definitions: TTFT is the first content chunk, ITLs the gaps between
// content chunks, E2E the last content chunk; output tokens come from the
// server's usage, else from the number of content chunks. start is the
// benchmark's start; inputLen the prompt length used when the server sent no
// usage.
func (t *Timeline) Result(start time.Time, inputLen int) RequestResult {
	r := RequestResult{Start: t.Sent.Sub(start), Err: t.Err, InputLen: inputLen, OutputLen: len(t.Chunks)}
	if t.PromptTokens >= 0 {
		r.InputLen = t.PromptTokens
	}
	if t.CompletionTokens >= 0 {
		r.OutputLen = t.CompletionTokens
	}
	if t.CachedTokens > 0 {
		r.CachedTokens = t.CachedTokens
	}
	if len(t.Chunks) == 0 {
		if !t.End.IsZero() {
			r.TTFT = t.End.Sub(t.Sent)
			r.E2E = r.TTFT
		}
		return r
	}
	r.TTFT = t.Chunks[0].Sub(t.Sent)
	r.E2E = t.Chunks[len(t.Chunks)-1].Sub(t.Sent)
	r.ITL = make([]time.Duration, len(t.Chunks)-1)
	for i := 1; i < len(t.Chunks); i++ {
		r.ITL[i-1] = t.Chunks[i].Sub(t.Chunks[i-1])
	}
	return r
}

// SLO holds goodput targets; zero fields are unset. A request is good when
// it succeeded and meets every set target (vLLM's --goodput).
type SLO struct {
	TTFT, TPOT, E2EL time.Duration
}

// IsZero reports whether no target is set.
func (s SLO) IsZero() bool { return s == SLO{} }

// Meets reports whether r meets the targets.
func (s SLO) Meets(r *RequestResult) bool {
	return r.OK() &&
		(s.TTFT == 0 || r.TTFT <= s.TTFT) &&
		(s.TPOT == 0 || r.TPOT() <= s.TPOT) &&
		(s.E2EL == 0 || r.E2E <= s.E2EL)
}

// String is the SLO as ParseSLO reads it.
func (s SLO) String() string {
	var parts []string
	for _, f := range []struct {
		k string
		v time.Duration
	}{{"ttft", s.TTFT}, {"tpot", s.TPOT}, {"e2el", s.E2EL}} {
		if f.v > 0 {
			parts = append(parts, f.k+":"+strconv.FormatFloat(ms(f.v), 'f', -1, 64))
		}
	}
	return strings.Join(parts, " ")
}

// ParseSLO reads targets in milliseconds as vLLM writes them:
// "ttft:500 tpot:50", separated by spaces or commas; keys ttft, tpot, e2el.
func ParseSLO(s string) (SLO, error) {
	var slo SLO
	err := slo.Add(s)
	return slo, err
}

// Add reads more targets into s (see ParseSLO).
func (s *SLO) Add(text string) error {
	for _, f := range strings.FieldsFunc(text, func(r rune) bool { return r == ' ' || r == ',' }) {
		k, v, ok := strings.Cut(f, ":")
		if !ok {
			return fmt.Errorf("bench: goodput target %q: want name:milliseconds", f)
		}
		x, err := strconv.ParseFloat(v, 64)
		if err != nil || !(x > 0) || math.IsInf(x, 0) {
			return fmt.Errorf("bench: goodput target %q: want a positive number of milliseconds", f)
		}
		d := time.Duration(x * float64(time.Millisecond))
		switch strings.ToLower(k) {
		case "ttft":
			s.TTFT = d
		case "tpot":
			s.TPOT = d
		case "e2el":
			s.E2EL = d
		default:
			return fmt.Errorf("bench: goodput target %q: unknown metric %q (want ttft, tpot or e2el)", f, k)
		}
	}
	return nil
}

// Stats summarises a metric in milliseconds.
type Stats struct {
	N           int
	Mean        float64
	Median      float64
	Std         float64             // population standard deviation, as numpy's
	Percentiles map[float64]float64 // by percentile (e.g. 99)
}

// Percentile returns the p-th percentile of sorted values, interpolating
// linearly between closest ranks (numpy's default, which vLLM uses).
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	if p <= 0 {
		return sorted[0]
	}
	if p >= 100 {
		return sorted[n-1]
	}
	rank := p / 100 * float64(n-1)
	lo := int(math.Floor(rank))
	if lo+1 >= n {
		return sorted[n-1]
	}
	frac := rank - float64(lo)
	return sorted[lo] + frac*(sorted[lo+1]-sorted[lo])
}

// ComputeStats summarises values (in ms).
func ComputeStats(values []float64, percentiles []float64) Stats {
	s := Stats{N: len(values), Percentiles: map[float64]float64{}}
	for _, p := range percentiles {
		s.Percentiles[p] = 0
	}
	if len(values) == 0 {
		return s
	}
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	var sum float64
	for _, v := range sorted {
		sum += v
	}
	s.Mean = sum / float64(len(sorted))
	var ss float64
	for _, v := range sorted {
		ss += (v - s.Mean) * (v - s.Mean)
	}
	s.Std = math.Sqrt(ss / float64(len(sorted)))
	s.Median = Percentile(sorted, 50)
	for _, p := range percentiles {
		s.Percentiles[p] = Percentile(sorted, p)
	}
	return s
}

// Summary is a run's aggregate, with vLLM benchmark_serving's definitions.
type Summary struct {
	Completed, Failed       int
	Duration                time.Duration // first send → last finish
	TotalInput, TotalOutput int           // of completed requests
	TotalCached             int           // cached prompt tokens the server reported
	RequestThroughput       float64       // completed / duration
	RequestGoodput          float64       // requests meeting the SLO / duration (when set)
	OutputThroughput        float64       // output tokens / duration
	TotalTokenThroughput    float64       // (input + output tokens) / duration
	PeakOutputThroughput    float64       // most output tokens in one second
	PeakConcurrency         int           // most requests in flight at once
	TTFT, TPOT, ITL, E2EL   Stats         // in ms
}

// Summarize aggregates request results over a run of the given duration.
func Summarize(reqs []RequestResult, duration time.Duration, slo SLO, percentiles []float64) Summary {
	var s Summary
	s.Duration = duration
	var ttft, tpot, itl, e2el []float64
	good := 0
	for i := range reqs {
		r := &reqs[i]
		if !r.OK() {
			s.Failed++
			continue
		}
		s.Completed++
		s.TotalInput += r.InputLen
		s.TotalOutput += r.OutputLen
		s.TotalCached += r.CachedTokens
		ttft = append(ttft, ms(r.TTFT))
		e2el = append(e2el, ms(r.E2E))
		if r.OutputLen > 1 {
			tpot = append(tpot, ms(r.TPOT()))
		}
		for _, d := range r.ITL {
			itl = append(itl, ms(d))
		}
		if !slo.IsZero() && slo.Meets(r) {
			good++
		}
	}
	if sec := duration.Seconds(); sec > 0 {
		s.RequestThroughput = float64(s.Completed) / sec
		s.RequestGoodput = float64(good) / sec
		s.OutputThroughput = float64(s.TotalOutput) / sec
		s.TotalTokenThroughput = float64(s.TotalInput+s.TotalOutput) / sec
	}
	s.TTFT = ComputeStats(ttft, percentiles)
	s.TPOT = ComputeStats(tpot, percentiles)
	s.ITL = ComputeStats(itl, percentiles)
	s.E2EL = ComputeStats(e2el, percentiles)
	for _, p := range Timeseries(reqs, time.Second) {
		s.PeakOutputThroughput = max(s.PeakOutputThroughput, p.OutputTokens)
	}
	s.PeakConcurrency = peakConcurrency(reqs)
	return s
}

// Point is one bucket of a run's timeline.
type Point struct {
	T            time.Duration // bucket start, from the benchmark's start
	OutputTokens float64       // output tokens per second in the bucket
	Completed    float64       // requests finished per second in the bucket
	InFlight     float64       // requests in flight, averaged over the bucket
}

// Timeseries buckets successful requests' output tokens and completions. A
// request's output tokens are spread evenly over its content chunks (one
// each when the server streams a token per chunk); a request without
// content chunks counts its tokens at its end.
func Timeseries(reqs []RequestResult, bucket time.Duration) []Point {
	if bucket <= 0 {
		return nil
	}
	var end time.Duration
	for i := range reqs {
		end = max(end, reqs[i].End())
	}
	n := int(end/bucket) + 1
	pts := make([]Point, n)
	for i := range pts {
		pts[i].T = time.Duration(i) * bucket
	}
	idx := func(t time.Duration) int { return min(max(int(t/bucket), 0), n-1) }
	per := bucket.Seconds()
	for i := range reqs {
		r := &reqs[i]
		// Time in flight, per bucket.
		for b := idx(r.Start); b < n && pts[b].T < r.End(); b++ {
			lo, hi := max(pts[b].T, r.Start), min(pts[b].T+bucket, r.End())
			pts[b].InFlight += (hi - lo).Seconds() / per
		}
		if !r.OK() {
			continue
		}
		pts[idx(r.End())].Completed += 1 / per
		chunks := len(r.ITL) + 1
		if r.OutputLen == 0 {
			continue
		}
		each := float64(r.OutputLen) / float64(chunks) / per
		t := r.Start + r.TTFT
		pts[idx(t)].OutputTokens += each
		for _, d := range r.ITL {
			t += d
			pts[idx(t)].OutputTokens += each
		}
	}
	return pts
}

// peakConcurrency is the most requests whose [Start, End] overlap.
func peakConcurrency(reqs []RequestResult) int {
	type ev struct {
		t time.Duration
		d int
	}
	evs := make([]ev, 0, 2*len(reqs))
	for i := range reqs {
		evs = append(evs, ev{reqs[i].Start, 1}, ev{reqs[i].End(), -1})
	}
	slices.SortFunc(evs, func(a, b ev) int {
		if a.t != b.t {
			return cmp.Compare(a.t, b.t)
		}
		return a.d - b.d // ends before starts at the same instant
	})
	cur, peak := 0, 0
	for _, e := range evs {
		cur += e.d
		peak = max(peak, cur)
	}
	return peak
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
