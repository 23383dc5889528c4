package node

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"tandem/engine"
	"tandem/model"
)

// post sends body to the node's path and returns the status and the answer.
func post(t *testing.T, n *Node, path, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(n.URL()+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func get(t *testing.T, n *Node, path string) string {
	t.Helper()
	resp, err := http.Get(n.URL() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// A node serves LoRA adapters over the OpenAI API: one given at start and one loaded at run
// time are listed by /v1/models with the base as their parent, chosen by the model field,
// and unloaded again; the counts are on /metrics, with speculative decoding's.
func TestNodeServesAdapters(t *testing.T) {
	m, be := demoModel(t)
	dir := t.TempDir()
	for i, p := range []string{filepath.Join(dir, "a0.gguf"), filepath.Join(dir, "a1")} {
		a, err := model.RandomAdapter(m, 4, 8, uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			err = a.WriteGGUF(p)
		} else {
			err = a.WritePEFT(p)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	n, err := Start(context.Background(), Config{Model: m, Backend: be, Name: "tandem-demo", KVBudget: 256 * 16 * m.KVBytesPerToken(),
		BlockSize: 16, HTTP: HTTP{Addr: "127.0.0.1:0"}, Logger: quiet,
		LoRA: []LoRA{{Name: "a0", Path: filepath.Join(dir, "a0.gguf")}}, RuntimeLoRA: true,
		Speculation: engine.Speculation{Method: engine.SpecNGram}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Shutdown(context.Background()) })

	models := func() map[string]string {
		var list struct {
			Data []struct{ ID, Parent string }
		}
		if err := json.Unmarshal([]byte(get(t, n, "/v1/models")), &list); err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, d := range list.Data {
			out[d.ID] = d.Parent
		}
		return out
	}
	if got := models(); len(got) != 2 || got["a0"] != "tandem-demo" {
		t.Errorf("/v1/models: %v, want tandem-demo and a0 (parent tandem-demo)", got)
	}
	complete := func(name string) (int, string) {
		return post(t, n, "/v1/completions", `{"model":"`+name+`","prompt":"Hello hello hello","max_tokens":12,"temperature":0,"ignore_eos":true}`)
	}
	if code, body := complete("a0"); code != 200 || !strings.Contains(body, `"model":"a0"`) {
		t.Errorf("a completion under a0: %d %.300s", code, body)
	}
	if code, body := post(t, n, "/v1/load_lora_adapter", `{"lora_name":"a1","lora_path":"`+filepath.Join(dir, "a1")+`"}`); code != 200 {
		t.Fatalf("loading a1: %d %s", code, body)
	}
	if got := models(); got["a1"] != "tandem-demo" {
		t.Errorf("/v1/models after loading a1: %v", got)
	}
	if code, body := complete("a1"); code != 200 || !strings.Contains(body, `"model":"a1"`) {
		t.Errorf("a completion under a1: %d %.300s", code, body)
	}
	if code, body := post(t, n, "/v1/completions", `{"model":"a1","prompt":"Hi","max_tokens":4,"speculative_decoding":false}`); code != 200 {
		t.Errorf("speculative_decoding false: %d %.300s", code, body)
	}
	for _, tc := range []struct {
		path, body string
		code       int
		want       string
	}{
		{"/v1/load_lora_adapter", `{"lora_name":"a1","lora_path":"` + filepath.Join(dir, "a1") + `"}`, 400, "loaded already"},
		{"/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"` + filepath.Join(dir, "none") + `"}`, 400, "no such file"},
		{"/v1/load_lora_adapter", `{"lora_name":"tandem-demo","lora_path":"` + filepath.Join(dir, "a1") + `"}`, 400, "served model"},
		{"/v1/load_lora_adapter", `{"lora_name":"x"}`, 400, "must be provided"},
		{"/v1/unload_lora_adapter", `{"lora_name":"a1"}`, 200, "removed"},
		{"/v1/unload_lora_adapter", `{"lora_name":"a1"}`, 404, "no LoRA adapter"},
		{"/v1/completions", `{"model":"a1","prompt":"Hi","max_tokens":2}`, 404, "does not exist"},
	} {
		if code, body := post(t, n, tc.path, tc.body); code != tc.code || !strings.Contains(body, tc.want) {
			t.Errorf("%s %s: %d %.300s; want %d saying %q", tc.path, tc.body, code, body, tc.code, tc.want)
		}
	}
	met := get(t, n, "/metrics")
	for _, want := range []string{`tandem:lora_adapters_registered{model_name="tandem-demo"} 1`, `tandem:lora_requests_total{lora_name="a0",model_name="tandem-demo"} 1`,
		"tandem:spec_decode_num_draft_tokens_total", "tandem:spec_decode_draft_acceptance_rate"} {
		if !strings.Contains(met, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// Without RuntimeLoRA the run-time adapter API is not served: it reads paths a client names.
func TestNodeRuntimeLoRAOff(t *testing.T) {
	m, be := demoModel(t)
	n, err := Start(context.Background(), Config{Model: m, Backend: be, Name: "tandem-demo", KVBudget: 64 * 16 * m.KVBytesPerToken(),
		BlockSize: 16, HTTP: HTTP{Addr: "127.0.0.1:0"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Shutdown(context.Background()) })
	if code, _ := post(t, n, "/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"/etc/passwd"}`); code != 404 {
		t.Errorf("load_lora_adapter without RuntimeLoRA: %d, want 404", code)
	}
}

// A draft model's KV comes out of the same budget: the pool has fewer blocks.
func TestNodeDraftModelShareKVBudget(t *testing.T) {
	m, be := demoModel(t)
	d, _ := demoModel(t)
	budget := 256 * 16 * m.KVBytesPerToken()
	n, err := Start(context.Background(), Config{Model: m, Backend: be, Name: "tandem-demo", KVBudget: budget,
		BlockSize: 16, HTTP: HTTP{Addr: "127.0.0.1:0"}, Logger: quiet,
		Speculation: engine.Speculation{Method: engine.SpecDraft, Draft: d}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Shutdown(context.Background()) })
	if want := int(budget / ((m.KVBytesPerToken() + d.KVBytesPerToken()) * 16)); n.KVBlocks() != want {
		t.Errorf("%d blocks with a draft model, want %d (the budget over both models' KV)", n.KVBlocks(), want)
	}
	if code, body := post(t, n, "/v1/completions", `{"prompt":"Hello hello hello","max_tokens":8,"temperature":0}`); code != 200 {
		t.Errorf("a completion with a draft model: %d %.300s", code, body)
	}
}
