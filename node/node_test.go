package node

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"tandem/gguf"
	"tandem/hal/cpu"
	"tandem/llm"
	"tandem/model"
	"tandem/modelgen"
	"tandem/sim"
)

func demoModel(t *testing.T) (*model.Model, *cpu.Backend) {
	t.Helper()
	be := cpu.New(1)
	data, err := modelgen.DemoGGUF()
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.FromGGUF(f, be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); be.Close() })
	return m, be
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func TestStartRefuses(t *testing.T) {
	m, be := demoModel(t)
	for name, cfg := range map[string]Config{
		"no model":          {Name: "x"},
		"no name":           {Model: m, Backend: be},
		"replicas, no sim":  {Model: m, Backend: be, Name: "x", Replicas: 2},
		"tiny KV budget":    {Model: m, Backend: be, Name: "x", KVBudget: 1},
		"bad HTTP address":  {Model: m, Backend: be, Name: "x", HTTP: HTTP{Addr: "nowhere"}},
		"replicas, no join": {Model: m, Backend: be, Name: "x", Replicas: 2},
	} {
		cfg.Logger = quiet
		if n, err := Start(context.Background(), cfg); err == nil {
			n.Shutdown(context.Background())
			t.Errorf("%s: started", name)
		}
	}
}

// TestShutdown: a node serves, lowers the context to what its KV budget holds, and its
// Shutdown lets a running request finish before the engine stops.
func TestShutdown(t *testing.T) {
	m, be := demoModel(t)
	n, err := Start(context.Background(), Config{Model: m, Backend: be, Name: "tandem-demo", KVBudget: 64 * 16 * m.KVBytesPerToken(),
		BlockSize: 16, HTTP: HTTP{Addr: "127.0.0.1:0"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if n.KVBlocks() != 64 || n.ContextLen() != 64*16 {
		t.Errorf("%d blocks, context %d; want 64 blocks and the context lowered to 1024", n.KVBlocks(), n.ContextLen())
	}
	done := make(chan string, 1)
	go func() {
		resp, err := http.Post(n.URL()+"/v1/completions", "application/json",
			strings.NewReader(`{"prompt":"Hello","max_tokens":900,"ignore_eos":true}`))
		if err != nil {
			done <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		done <- string(b)
	}()
	for t0 := time.Now(); n.Engines()[0].Stats().Running == 0; time.Sleep(time.Millisecond) {
		if time.Since(t0) > 10*time.Second {
			t.Fatal("the request never ran")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if body := <-done; !strings.Contains(body, `"completion_tokens":900`) {
		t.Errorf("the running request did not finish: %.300s", body)
	}
	if _, err := n.Engines()[0].Generate(context.Background(), &llm.Request{Prompt: []int32{1, 2}}); !errors.Is(err, llm.ErrUnavailable) {
		t.Errorf("the engine still takes requests after Shutdown: %v", err)
	}
}

// With an ITL target and no step profile, a node on a real backend measures its forward
// step at start (and says what it found); with a profile (and a target of 2.5 times the
// decodes) it measures nothing; a quick profile past its budget gives way to the built-in
// one, said in the log and on /metrics. Either way it serves.
func TestITLTargetStepCost(t *testing.T) {
	m, be := demoModel(t)
	for _, c := range []struct {
		profile *sim.Timing
		budget  time.Duration
		source  string // of the profile, on /metrics
		log     string
	}{
		{nil, 0, "measured", "measured the step cost"},
		{&sim.Timing{PrefillPerToken: 1, DecodeBase: 5, DecodePerSeq: 1}, 0, "file", ""},
		{nil, time.Nanosecond, "builtin", "the quick profile of the step cost took too long"},
	} {
		var logs bytes.Buffer
		cfg := Config{Model: m, Backend: be, Name: "tandem-demo", KVBudget: 256 * 16 * m.KVBytesPerToken(),
			BlockSize: 16, HTTP: HTTP{Addr: "127.0.0.1:0"}, ITLTarget: 50 * time.Millisecond, StepCost: c.profile,
			StepProfileBudget: c.budget, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
		if c.profile != nil {
			cfg.ITLTarget, cfg.ITLTargetDecodes = 0, 2.5
		}
		n, err := Start(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post(n.URL()+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"Hello","max_tokens":8}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		mresp, err := http.Get(n.URL() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		scrape, _ := io.ReadAll(mresp.Body)
		mresp.Body.Close()
		n.Shutdown(context.Background())
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: status %d", c.source, resp.StatusCode)
		}
		if measured := strings.Contains(logs.String(), "measured the step cost"); measured != (c.source == "measured") {
			t.Errorf("%s: measured at start %v:\n%s", c.source, measured, logs.String())
		}
		if c.log != "" && !strings.Contains(logs.String(), c.log) {
			t.Errorf("%s: the log lacks %q:\n%s", c.source, c.log, logs.String())
		}
		if want := `tandem:step_cost_profile{model_name="tandem-demo",source="` + c.source + `"} 1`; !strings.Contains(string(scrape), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
