package worker_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/model"
	"tandem/openai"
	"tandem/router"
	"tandem/router/live"
)

// A router learns the workers' LoRA adapters from their load reports: /v1/models lists
// them under the model, a request naming one goes to a worker that serves it and gets what
// that engine gives alone, and one naming an adapter no worker serves is refused.
func TestClusterRoutesByAdapter(t *testing.T) {
	path := writeTestAdapter(t)

	c := startRouter(t, router.ModeKV)
	token := c.router.Token.String()
	with := c.addWorkerOpts("with", token, workerOpts{adapters: map[string]string{"tell": path}})
	c.addWorker("without", token, 0)
	c.waitWorkers(2)
	waitFor(t, "the adapter in /v1/models", func() bool {
		resp, err := http.Get(c.router.URL() + "/v1/models")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var list struct {
			Data []struct{ ID, Parent string }
		}
		json.NewDecoder(resp.Body).Decode(&list)
		for _, d := range list.Data {
			if d.ID == "tell" && d.Parent == modelName {
				return true
			}
		}
		return false
	})

	post := func(base, model string) (int, string, string) { return completeAdapter(t, base, model) }
	// The engine's own answer under the adapter.
	direct := directAdapters(t, with)
	_, want, _ := post(direct, "tell")
	for range 4 {
		code, text, worker := post(c.router.URL(), "tell")
		if code != 200 || worker != "with" || text != want {
			t.Errorf("through the router: %d from %q: %q; want 200 from \"with\": %q", code, worker, text, want)
		}
	}
	if code, _, _ := post(c.router.URL(), "nope"); code != http.StatusNotFound {
		t.Errorf("an adapter no worker serves: %d, want 404", code)
	}
	if code, _, _ := post(c.router.URL(), modelName); code != 200 {
		t.Errorf("the base model: %d", code)
	}
}

// completeAdapter posts a greedy completion of longPrompt under model (an adapter's name)
// to base and returns the status, the text (or the body of an error) and the worker.
func completeAdapter(t *testing.T, base, model string) (int, string, string) {
	t.Helper()
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(
		`{"model":"`+model+`","prompt":"`+longPrompt+`","max_tokens":16,"temperature":0}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out struct {
		Choices []struct{ Text string }
	}
	json.Unmarshal(b, &out)
	text := string(b)
	if len(out.Choices) > 0 {
		text = out.Choices[0].Text
	}
	return resp.StatusCode, text, resp.Header.Get(openai.WorkerHeader)
}

// writeTestAdapter writes a random adapter of the stories fixture and returns its path.
func writeTestAdapter(t *testing.T) string {
	t.Helper()
	be := cpu.New(1)
	defer be.Close()
	m, err := model.Load(fixtures.Model(t, "stories260K-f32.gguf"), be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	a, err := model.RandomAdapter(m, 4, 8, 7)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tell.gguf")
	if err := a.WriteGGUF(path); err != nil {
		t.Fatal(err)
	}
	return path
}

// The router's run-time adapter API loads an adapter on a worker and routes its requests
// there; when that worker leaves, the next request loads it on another; an unload through
// the router unloads it from the workers.
func TestClusterRouterLoadsAdapters(t *testing.T) {
	path := writeTestAdapter(t)
	c := startRouterLive(t, live.Config{Policy: router.DefaultConfig(), Heartbeat: 50 * time.Millisecond, HeartbeatTimeout: 2 * time.Second,
		RuntimeLoRA: true})
	token := c.router.Token.String()
	nodes := map[string]*node{"w1": c.addWorker("w1", token, 0), "w2": c.addWorker("w2", token, 0)}
	c.waitWorkers(2)
	postAPI := func(path, body string) (int, string) {
		resp, err := http.Post(c.router.URL()+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := postAPI("/v1/load_lora_adapter", `{"lora_name":"tell","lora_path":"/nowhere"}`); code != 400 {
		t.Errorf("a bad path: %d %s, want 400", code, body)
	}
	if code, body := postAPI("/v1/load_lora_adapter", `{"lora_name":"tell","lora_path":"`+path+`"}`); code != 200 {
		t.Fatalf("load through the router: %d %s", code, body)
	}
	code, want, first := completeAdapter(t, c.router.URL(), "tell")
	if code != 200 || nodes[first] == nil {
		t.Fatalf("a completion under the loaded adapter: %d %q from %q", code, want, first)
	}
	nodes[first].stop()
	c.waitWorkers(1)
	code, got, second := completeAdapter(t, c.router.URL(), "tell")
	if code != 200 || second == first || got != want {
		t.Errorf("after %s left: %d %q from %q; want 200 %q from the other worker", first, code, got, second, want)
	}
	if code, body := postAPI("/v1/unload_lora_adapter", `{"lora_name":"tell"}`); code != 200 {
		t.Errorf("unload through the router: %d %s", code, body)
	}
	waitFor(t, "the unload to reach the reports", func() bool {
		code, _, _ := completeAdapter(t, c.router.URL(), "tell")
		return code == http.StatusNotFound
	})
}

// directAdapters serves a worker's engine's own API with its adapters, as a single node
// does, and returns its URL.
func directAdapters(t *testing.T, n *node) string {
	t.Helper()
	srv := httptest.NewServer(openai.NewHandler([]*openai.Model{{ID: modelName, Tokenizer: n.m.Tokenizer,
		ContextLen: n.m.Config.ContextLen, Backend: n.eng, Adapters: n.eng}}, openai.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	t.Cleanup(srv.Close)
	return srv.URL
}
