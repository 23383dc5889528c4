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

	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/model"
	"tandem/openai"
	"tandem/router"
)

// A router learns the workers' LoRA adapters from their load reports: /v1/models lists
// them under the model, a request naming one goes to a worker that serves it and gets what
// that engine gives alone, and one naming an adapter no worker serves is refused.
func TestClusterRoutesByAdapter(t *testing.T) {
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

	post := func(base, model string) (int, string, string) {
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

// directAdapters serves a worker's engine's own API with its adapters, as a single node
// does, and returns its URL.
func directAdapters(t *testing.T, n *node) string {
	t.Helper()
	srv := httptest.NewServer(openai.NewHandler([]*openai.Model{{ID: modelName, Tokenizer: n.m.Tokenizer,
		ContextLen: n.m.Config.ContextLen, Backend: n.eng, Adapters: n.eng}}, openai.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}))
	t.Cleanup(srv.Close)
	return srv.URL
}
