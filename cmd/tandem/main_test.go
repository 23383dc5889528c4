package main

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"tandem/gguf"
	"tandem/hal/cpu"
	"tandem/internal/fixtures"
	"tandem/model"
)

func runMain(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = mainWithArgs(args, &out, &errb)
	return out.String(), errb.String(), code
}

func TestRunStoriesGreedy(t *testing.T) {
	path := fixtures.Model(t, "stories260K-f32.gguf")
	// Flags after the prompt work too, as users type them.
	out, errOut, code := runMain(t, "run", "--model", path, "Once upon a time", "--temperature", "0", "--max-tokens", "32")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	want := ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw"
	if got := strings.TrimSuffix(out, "\n"); got != want {
		t.Errorf("stdout %q, llama.cpp %q", got, want)
	}
	for _, s := range []string{"load time", "prompt: 5 tokens", "tokens/s", "generation: 32 tokens"} {
		if !strings.Contains(errOut, s) {
			t.Errorf("stderr lacks %q:\n%s", s, errOut)
		}
	}
}

func TestRunDemoModel(t *testing.T) {
	out, errOut, code := runMain(t, "run", "--max-tokens", "8", "--seed", "3", "Hello")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	out2, _, _ := runMain(t, "run", "--max-tokens", "8", "--seed", "3", "Hello")
	if len(strings.TrimSpace(out)) == 0 || out != out2 {
		t.Errorf("demo model with seed 3: %q then %q", out, out2)
	}
	if _, errOut, code := runMain(t, "run", "--chat", "--max-tokens", "4", "Hi"); code != 0 {
		t.Errorf("--chat on the demo model: exit %d: %s", code, errOut)
	}
}

func TestTokenize(t *testing.T) {
	path := fixtures.Model(t, "stories260K-f32.gguf")
	out, errOut, code := runMain(t, "tokenize", "--model", path, "Once upon a time")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var ids []int32
	if err := json.Unmarshal([]byte(out), &ids); err != nil || !slices.Equal(ids, []int32{1, 403, 407, 261, 378}) {
		t.Errorf("tokenize: %q (%v)", out, err)
	}
	qwen := fixtures.Model(t, "rand-qwen2-qwen2vocab-f32.gguf")
	out, _, _ = runMain(t, "tokenize", "--model", qwen, "--special", "<|im_start|>user")
	if err := json.Unmarshal([]byte(out), &ids); err != nil || len(ids) == 0 || ids[0] != 151644 {
		t.Errorf("tokenize --special: %q (%v)", out, err)
	}
}

func TestGenModel(t *testing.T) {
	vocab := fixtures.Model(t, "stories260K-f32.gguf")
	dir := t.TempDir()
	for _, typ := range []string{"f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k_m", "q5_k_m", "q6_k"} {
		out := filepath.Join(dir, typ+".gguf")
		_, errOut, code := runMain(t, "gen-model", "--arch", "qwen2", "--embd", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2",
			"--ffn", "512", "--type", typ, "--vocab-from", vocab, "--out", out)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", typ, code, errOut)
		}
		f, err := gguf.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		ti, ok := f.Tensor("blk.0.ffn_up.weight")
		tokens, _ := f.Strings("tokenizer.ggml.tokens")
		f.Close()
		if !ok || !strings.HasPrefix(strings.ToLower(ti.Type.String()), typ[:2]) || len(tokens) != 512 {
			t.Errorf("%s: ffn_up %v, %d tokens", typ, ti, len(tokens))
		}
		if _, errOut, code := runMain(t, "run", "--model", out, "--max-tokens", "3", "Once"); code != 0 {
			t.Errorf("%s: run: exit %d: %s", typ, code, errOut)
		}
	}
}

// gen-lora writes adapters that load: a GGUF file and a PEFT directory of the chosen
// rank and targets.
func TestGenLoRA(t *testing.T) {
	path := fixtures.Model(t, "stories260K-f32.gguf")
	dir := t.TempDir()
	for _, tc := range []struct{ format, out string }{{"gguf", filepath.Join(dir, "a.gguf")}, {"peft", filepath.Join(dir, "peft")}} {
		if _, errOut, code := runMain(t, "gen-lora", "--model", path, "--out", tc.out, "--format", tc.format, "--rank", "4", "--targets", "q,v,down"); code != 0 {
			t.Fatalf("%s: exit %d: %s", tc.format, code, errOut)
		}
		be := cpu.New(1)
		m, err := model.Load(path, be)
		if err != nil {
			t.Fatal(err)
		}
		a, err := model.LoadAdapter(tc.out, m, be)
		m.Close()
		be.Close()
		if err != nil || a.Rank != 4 || strings.Join(a.Targets, ",") != "attn_q,attn_v,ffn_down" {
			t.Errorf("%s: %+v, %v", tc.format, a, err)
		}
	}
}

func TestCLIErrors(t *testing.T) {
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"run"}, 1, "want exactly one prompt"},
		{[]string{"run", "--model", "/nonexistent.gguf", "hi"}, 1, "/nonexistent.gguf"},
		{[]string{"run", "--temperature", "-1", "hi"}, 1, "temperature"},
		{[]string{"run", "--bogus", "hi"}, 2, "flag provided but not defined"},
		{[]string{"gen-model", "--out", "/tmp/x.gguf", "--type", "q9_9", "--preset", "qwen2.5-0.5b"}, 1, `unknown type "q9_9"`},
		{[]string{"gen-model", "--preset", "gpt5"}, 1, "--out is required"},
		{[]string{"tokenize"}, 1, "want exactly one text"},
		{[]string{"gen-lora", "--out", "/tmp/x.gguf"}, 1, "--model and --out are required"},
		{[]string{"gen-lora", "--model", "m", "--out", "o", "--format", "bin"}, 1, `--format "bin"`},
		{[]string{"gen-lora", "--model", "m", "--out", "o", "--targets", "q,embd"}, 1, `unknown projection "embd"`},
		{[]string{"serve", "--lora", "nopath"}, 1, `--lora "nopath": want NAME=PATH`},
		{[]string{"serve", "--speculative", "eagle"}, 1, `--speculative "eagle"`},
		{[]string{"serve", "--speculative", "draft"}, 1, "--speculative draft needs --draft-model"},
		{[]string{"serve", "--speculative", "ngram", "--draft-model", "d.gguf"}, 1, "--draft-model drafts for --speculative draft"},
		{[]string{"serve", "--max-loras", "0"}, 1, "--max-loras 0"},
	}
	for _, tc := range cases {
		_, errOut, code := runMain(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

func TestBenchEngineJSON(t *testing.T) {
	out, errOut, code := runMain(t, "bench-engine", "-p", "16", "-n", "4", "--batch", "2,3", "-r", "1", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var results []struct {
		Test string  `json:"test"`
		TPS  float64 `json:"tokens_per_second"`
	}
	if err := json.Unmarshal([]byte(out), &results); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	var tests []string
	for _, r := range results {
		tests = append(tests, r.Test)
		if r.TPS <= 0 {
			t.Errorf("%s: %v tokens/s", r.Test, r.TPS)
		}
	}
	if !slices.Equal(tests, []string{"pp16", "tg4", "batch2", "batch3"}) {
		t.Errorf("tests %v", tests)
	}
}
