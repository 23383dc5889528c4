package sim

import (
	"testing"
	"time"

	"tandem/bench"
	"tandem/planner"
)

func TestDisaggregatedHandMade(t *testing.T) {
	// One prefill and one decode worker; a 16-token block is 1 MiB (65536 bytes a token)
	// and a transfer takes 1 ms + 1 ms/MiB.
	tm := fixed
	tm.TransferBase, tm.TransferPerMiB = 1, 1
	cfg := Config{PrefillWorkers: 1, DecodeWorkers: 1, Timing: tm, KVBytesPerToken: 65536}
	cfg.Disagg.MinRemoteTokens = 16
	// Request 0 (100 tokens, 3 out) prefills on P: 10 + 100 = 110 ms (its first token);
	// its 6 full blocks (6 MiB) reach D at 110 + 1 + 6 = 117 ms; D computes the last 4
	// tokens (10 + 4 = 14 ms: the echo of P's token, at 131), then decodes twice (20 + 2
	// = 22 ms each): ITL 43 and 22 ms, E2E 175. Request 1 (10 tokens, under the threshold)
	// arrives at 1 s and prefills on D: 10 + 10 = 20 ms.
	reqs := []Request{oneReq(0, 1, 100, 3), oneReq(time.Second, 2, 10, 2)}
	res := run(t, cfg, reqs)
	q := res.Bench.Requests
	if q[0].TTFT != 110*time.Millisecond || q[0].E2E != 175*time.Millisecond || len(q[0].ITL) != 2 ||
		q[0].ITL[0] != 43*time.Millisecond || q[0].ITL[1] != 22*time.Millisecond {
		t.Errorf("remote prefill: TTFT %v E2E %v ITL %v; want 110ms 175ms [43ms 22ms]", q[0].TTFT, q[0].E2E, q[0].ITL)
	}
	if q[1].TTFT != 20*time.Millisecond || q[1].E2E != 42*time.Millisecond {
		t.Errorf("local prefill: TTFT %v E2E %v; want 20ms 42ms", q[1].TTFT, q[1].E2E)
	}
	if res.RemotePrefills != 1 || res.Transferred != 6<<20 {
		t.Errorf("%d remote prefills, %d bytes moved; want 1 and 6 MiB", res.RemotePrefills, res.Transferred)
	}
	// P computed the prompt; D's import is not a cache hit of the request.
	if res.HitRate != 0 || res.Workers[0].Role != "prefill" || res.Workers[0].PrefillTokens != 100 ||
		res.Workers[1].CachedTokens != 96 || res.Workers[1].PrefillTokens != 4+10 {
		t.Errorf("hit rate %v, workers %+v", res.HitRate, res.Workers)
	}
	// A repeat of request 0's prompt finds D holding its blocks: under the threshold, D
	// computes the last partial block itself, nothing moves.
	reqs = append(reqs, Request{At: 2 * time.Second, Segments: reqs[0].Segments, OutputLen: 2})
	res = run(t, cfg, reqs)
	if res.RemotePrefills != 1 || res.Bench.Requests[2].TTFT != 14*time.Millisecond {
		t.Errorf("a cached repeat: %d remote prefills, TTFT %v; want 1 and 14ms", res.RemotePrefills, res.Bench.Requests[2].TTFT)
	}
	if res.WorkerSeconds[planner.Prefill] <= 0 || res.WorkerSeconds[planner.Decode] != res.WorkerSeconds[planner.Prefill] {
		t.Errorf("worker-seconds %v: both pools ran the whole time", res.WorkerSeconds)
	}
	for _, bad := range []Config{{PrefillWorkers: 1}, {PrefillWorkers: 1, DecodeWorkers: 1, Workers: 2}} {
		if _, err := Run(bad, reqs); err == nil {
			t.Errorf("%+v: accepted", bad)
		}
	}
}

func TestDisaggregatedLowersITLOnLongPrompts(t *testing.T) {
	// Long prompts arriving while others decode: aggregated, their chunks share the
	// decode steps; disaggregated, the decode worker only decodes.
	var reqs []Request
	for i := range 40 {
		reqs = append(reqs, Request{At: time.Duration(i) * 300 * time.Millisecond,
			Segments: []bench.Segment{{Seed: uint64(i), Len: 6000}}, OutputLen: 100})
	}
	gpu := GPUTiming()
	agg := run(t, Config{Workers: 2, Timing: gpu}, reqs)
	dis := run(t, Config{PrefillWorkers: 1, DecodeWorkers: 1, Timing: gpu}, reqs)
	a, d := agg.Bench.Summary, dis.Bench.Summary
	if d.Completed != 40 || a.Completed != 40 {
		t.Fatalf("completed %d and %d", a.Completed, d.Completed)
	}
	if d.TPOT.Mean >= a.TPOT.Mean*0.8 {
		t.Errorf("TPOT mean: aggregated %.1f ms, disaggregated %.1f ms; want the disaggregated one lower", a.TPOT.Mean, d.TPOT.Mean)
	}
	if dis.RemotePrefills != 40 {
		t.Errorf("%d of 40 prefilled remotely", dis.RemotePrefills)
	}
	t.Logf("TPOT mean agg %.1f dis %.1f; TTFT mean agg %.0f dis %.0f", a.TPOT.Mean, d.TPOT.Mean, a.TTFT.Mean, d.TTFT.Mean)
}
