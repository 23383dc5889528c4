package worker_test

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"tandem/cluster"
	"tandem/engine"
	"tandem/hal/cpu"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/model"
	"tandem/worker"
)

// BenchmarkPeerPullVsRecompute: a 4,096-token prefix pulled from a peer that holds it
// (Worker.Generate naming the peer: pull, then the last block and one token computed)
// against the same engine computing a 4,096-token prompt it lacks. One op is one of each;
// run with -benchtime 1x. The model has a 0.5B model's KV blocks (12 layers, 4 KV heads of
// 64: 384 KiB a block) and a lighter forward pass, so the comparison favours recomputing.
func BenchmarkPeerPullVsRecompute(b *testing.B) {
	path := benchModel(b, 8192)
	env := newPeerEnv(b)
	start := func(name string) *peerNode {
		be := cpu.New(0)
		m, err := model.Load(path, be)
		if err != nil {
			b.Fatal(err)
		}
		eng, err := engine.New(m, be, engine.Config{KVBlocks: 520, BlockSize: 16, Salt: kvcache.Salt(modelName, "", "")})
		if err != nil {
			b.Fatal(err)
		}
		return env.startEngine(name, path, m, eng, worker.Config{}, func() { m.Close(); be.Close() })
	}
	holder, puller := start("holder"), start("puller")
	const n = 4096
	tokens := func(text string) []int32 {
		p := holder.m.Tokenizer.Encode(strings.Repeat(text, 1+n/4), false, false)
		if len(p) < n+1 {
			b.Fatalf("%d tokens", len(p))
		}
		return p[:n+1] // 4,096 tokens of prefix (256 blocks) and one more
	}
	gen := func(e *engine.Engine, p []int32) []int32 {
		st, err := e.Generate(context.Background(), &llm.Request{Prompt: p, MaxTokens: 1})
		if err != nil {
			b.Fatal(err)
		}
		var out []int32
		for {
			ev, err := st.Next(context.Background())
			if errors.Is(err, io.EOF) {
				return out
			}
			if err != nil {
				b.Fatal(err)
			}
			out = append(out, ev.Token)
		}
	}
	var recompute, pull time.Duration
	round := 0
	for b.Loop() {
		round++
		a := tokens(strings.Repeat("x", round) + " the peer holds this prompt. ")
		other := tokens(strings.Repeat("y", round) + " the puller computes this one. ")
		want := gen(holder.eng, a) // the holder has a's blocks now
		t0 := time.Now()
		gen(puller.eng, other)
		recompute += time.Since(t0)

		c := env.dial(puller)
		t0 = time.Now()
		cs, err := c.Stream(context.Background(), cluster.MethodGenerate, &cluster.GenerateRequest{Request: llm.Request{Prompt: a, MaxTokens: 1},
			Peer: cluster.KVPeer{Addr: holder.w.Addr(), Node: "holder", Blocks: n / 16, TimeoutMs: 120000}})
		if err != nil {
			b.Fatal(err)
		}
		var got []int32
		var usage llm.Usage
		for {
			var ev cluster.GenerateEvent
			err := cs.RecvMsg(&ev)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
			if ev.Kind == cluster.EventError {
				b.Fatal(ev.Error())
			}
			if ev.Kind == cluster.EventToken {
				got = append(got, ev.Event.Token)
				usage = ev.Event.Usage
			}
		}
		pull += time.Since(t0)
		cs.Close()
		if !slices.Equal(got, want) || usage.CachedTokens < n {
			b.Fatalf("after the pull: %v (%d cached), computed %v", got, usage.CachedTokens, want)
		}
	}
	b.ReportMetric(recompute.Seconds()/float64(round), "recompute_s")
	b.ReportMetric(pull.Seconds()/float64(round), "pull_s")
	b.ReportMetric(recompute.Seconds()/pull.Seconds(), "speedup")
}
