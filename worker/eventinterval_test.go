package worker_test

import (
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"

	"tandem/router"
	"tandem/router/live"
	"tandem/sim"
)

// KV events wait for Config.EventInterval while no request of the router streams a message
// a token, and go with the next load report or a sequence's first token or end; while one
// streams, they go at once (they ride in the packets of its tokens). The router's heartbeat
// is long here, so that periodic reports do not send them early.
func TestEventInterval(t *testing.T) {
	// Seven blocks stored during decode (the model's context is 128 tokens), a modelled
	// step every 5 ms: a block every 80 ms.
	const maxTokens = 120
	for _, tc := range []struct {
		name     string
		interval time.Duration
		stream   bool
		// fewest and most event batches the router may receive for the request
		least, most float64
	}{
		{"held", time.Hour, false, 1, 3},
		{"streamed", time.Hour, true, 5, 1000},
		{"at-once", -1, false, 5, 1000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 5 * time.Second,
				HeartbeatTimeout: 20 * time.Second})
			n := c.addWorkerOpts("w1", c.router.Token.String(), workerOpts{timing: &sim.Timing{DecodeBase: 5},
				eventInterval: tc.interval})
			c.waitWorkers(1)
			batches := func() float64 {
				return scrape(t, c.router.URL(), "tandem_router:worker_messages_total", `kind="events"`, `via="stream"`)
			}
			before := max(batches(), 0) // no series before the first batch
			params := sdk.CompletionNewParams{Model: modelName, Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("Once upon a time")},
				Temperature: sdk.Float(0), MaxTokens: sdk.Int(maxTokens)}
			rc := client(c.router.URL())
			if tc.stream {
				stream := rc.Completions.NewStreaming(testCtx(t), params)
				for stream.Next() {
				}
				if err := stream.Err(); err != nil {
					t.Fatal(err)
				}
			} else if _, err := rc.Completions.New(testCtx(t), params); err != nil {
				t.Fatal(err)
			}
			// The end of the sequence sends what waits: the router's index has every block
			// of the answer well before the next periodic report (5 s).
			held := n.eng.Pool().Stats().Held
			deadline := time.Now().Add(2 * time.Second)
			for {
				w, _ := c.worker("w1")
				if w.Blocks == held {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the router's index holds %d blocks of w1 2 s after the answer, the worker %d", w.Blocks, held)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if got := batches() - before; got < tc.least || got > tc.most {
				t.Errorf("%v KV event batches for the request, want %v to %v", got, tc.least, tc.most)
			}
		})
	}
}

// A held answer's prompt blocks reach the router's index with its first token, while the
// answer is still being generated (not at its end, nor at the next periodic report 5 s on).
func TestEventIntervalPromptAtFirstToken(t *testing.T) {
	c := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 5 * time.Second,
		HeartbeatTimeout: 20 * time.Second})
	// 60 tokens at a modelled 10 ms each: the answer takes 600 ms after its first token.
	n := c.addWorkerOpts("w1", c.router.Token.String(), workerOpts{timing: &sim.Timing{DecodeBase: 10},
		eventInterval: time.Hour})
	c.waitWorkers(1)
	const prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."
	promptBlocks := len(n.m.Tokenizer.Encode(prompt, true, true)) / 16
	if promptBlocks < 2 {
		t.Fatalf("the prompt fills %d blocks; the test wants 2 or more", promptBlocks)
	}
	// A first request whose blocks make a batch: from then on batches wait for the interval
	// (the first after a quiet time goes at once).
	if _, err := client(c.router.URL()).Completions.New(testCtx(t), sdk.CompletionNewParams{Model: modelName,
		Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String("The dog")}, Temperature: sdk.Float(0), MaxTokens: sdk.Int(40)}); err != nil {
		t.Fatal(err)
	}
	before, _ := c.worker("w1")
	done := make(chan error, 1)
	go func() {
		_, err := client(c.router.URL()).Completions.New(testCtx(t), sdk.CompletionNewParams{Model: modelName,
			Prompt: sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(prompt)}, Temperature: sdk.Float(0), MaxTokens: sdk.Int(60)})
		done <- err
	}()
	for {
		select {
		case err := <-done:
			w, _ := c.worker("w1")
			t.Fatalf("the answer came (error %v) while the router's index held %d blocks of w1 (%d before it), want the prompt's %d more before", err, w.Blocks, before.Blocks, promptBlocks)
		default:
		}
		if w, _ := c.worker("w1"); w.Blocks >= before.Blocks+promptBlocks {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
