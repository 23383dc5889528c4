package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tandem/internal/fixtures"
)

// startTestRouter starts a tandem-router with extra flags and returns it, its API's base
// URL and the flags that make an engine join it.
func startTestRouter(t *testing.T, extra ...string) (router *proc, base string, join []string) {
	t.Helper()
	rbin, err := buildRouter()
	if err != nil {
		t.Fatal(err)
	}
	oport := strconv.Itoa(freeTCPPort(t))
	router = startProc(t, rbin, append([]string{"--port", "0", "--orpc-port", oport, "--state-dir", t.TempDir()}, extra...)...)
	m := router.wait(t, `tandem-router: (http://\S+)(?s:.*)join token: (\S+)`)
	return router, m[1], []string{"--join", "127.0.0.1:" + oport, "--join-token", m[2]}
}

// pipelineWorker is a 2-stage replica as processes: its head, which joins the routers,
// and stage 1, whose /metrics is at stageURL.
type pipelineWorker struct {
	head     *server
	stage    *proc
	stageURL string
}

// startPipelineWorker starts a 2-stage replica of modelPath (served as "m") named name,
// of role role, joining with join; extra flags go to both processes.
func startPipelineWorker(t *testing.T, modelPath, role, name string, join []string, extra ...string) *pipelineWorker {
	t.Helper()
	ca := filepath.Join(t.TempDir(), "ca")
	stage, addr := startStage(t, modelPath, 2, 1, "", ca, extra...)
	url := "http://" + stage.wait(t, `metrics: http://(\S+)/metrics`)[1]
	args := append([]string{"--model", modelPath, "--served-model-name", "m", "--stages", "2", "--stage-next", addr,
		"--stage-ca", ca, "--role", role, "--node-name", name, "--state-dir", t.TempDir()}, join...)
	return &pipelineWorker{head: startServe(t, append(args, extra...)...), stage: stage, stageURL: url}
}

// leave stops the replica's head gracefully (it deregisters) and its stage, and waits
// until the router saw it go.
func (w *pipelineWorker) leave(t *testing.T, router *proc, name string) {
	t.Helper()
	w.head.cmd.Process.Signal(syscall.SIGTERM)
	router.wait(t, `worker left[^\n]*worker=`+name+` `)
	w.stage.cmd.Process.Kill()
}

// disaggPrompt is prompt i of the disaggregated tests: about 70 tokens of the stories
// fixture, above the router's --disagg-min-tokens 32, with room for 24 more in its context.
func disaggPrompt(i int) string {
	return fmt.Sprintf("Story %d. ", i) + strings.Repeat("Lily and Ben played in the park with a big red ball. ", 3)
}

// completeEach sends prompts first … first+n-1 at once to base and returns their texts.
func completeEach(t *testing.T, base string, first, n, maxTokens int) []string {
	t.Helper()
	out := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i], errs[i] = complete1(base, disaggPrompt(first+i), maxTokens) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("prompt %d: %v", first+i, err)
		}
	}
	return out
}

// sameTexts checks that each text of got is want's.
func sameTexts(t *testing.T, how string, got, want []string) {
	t.Helper()
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("text %d, %s: %q, one engine %q", i, how, got[i], want[i])
		}
	}
}

// TestPipelineDisaggregated: a router, a 2-stage prefill replica and a 2-stage decode
// replica (five processes). 8 concurrent long prompts are prefilled on the prefill replica
// and decoded on the decode replica with one engine's text; the router counts 8 remote
// prefills and no fallback, the decode replica 8 good pulls, and each stage moved its
// layers' share of the bytes (stage 1 of the prefill replica read what stage 1 of the
// decode replica wrote). A prefill replica of another split moves its blocks the same way
// (a block's bytes are the whole model's, whatever the split). One whose KV is f16 is
// never asked: its card names a KV format the decode replica cannot import, so the router
// leaves the prefill on the decode replica, counts it as kv_format_mismatch and logs it
// once, naming both formats; no prefill is wasted and the text is one engine's.
func TestPipelineDisaggregated(t *testing.T) {
	modelPath := fixtures.Model(t, "stories260K-f32.gguf") // 5 layers: split 3,2
	const maxTokens = 24
	one := startServe(t, "--model", modelPath, "--served-model-name", "m")
	want := completeEach(t, one.url, 0, 12, maxTokens)
	one.stop(t)

	router, base, join := startTestRouter(t, "--disagg-min-tokens", "32")
	p := startPipelineWorker(t, modelPath, "prefill", "p", join, "--threads", "1")
	d := startPipelineWorker(t, modelPath, "decode", "d", join, "--threads", "1")
	router.wait(t, `worker joined[^\n]*worker=p [^\n]*role=prefill stages=2`)
	router.wait(t, `worker joined[^\n]*worker=d [^\n]*role=decode stages=2`)

	sameTexts(t, "through two 2-stage replicas", completeEach(t, base, 0, 8, maxTokens), want)
	if n := scrapeURL(t, base, "tandem_router:prefills_total", `where="remote"`); n != 8 {
		t.Errorf("remote prefills %v, want 8:\n%s", n, grepLines(router.text(), "prefill"))
	}
	if n := scrapeURL(t, base, "tandem_router:remote_prefill_fallbacks_total", `stage="prefill"`); n > 0 {
		t.Errorf("%v prefill fallbacks", n)
	}
	if n := scrapeURL(t, d.head.url, "tandem:kv_transfer_pulls_total", `result="ok"`); n != 8 {
		t.Errorf("the decode replica's good pulls: %v, want 8", n)
	}
	received := scrapeURL(t, d.head.url, "tandem:kv_transfer_bytes_total", `direction="received"`)
	read0 := scrapeURL(t, p.head.url, "tandem:pipeline_kv_bytes_total", `op="read"`)
	read1 := scrapeURL(t, p.stageURL, "tandem:pipeline_kv_bytes_total", `op="read"`)
	wrote0 := scrapeURL(t, d.head.url, "tandem:pipeline_kv_bytes_total", `op="write"`)
	wrote1 := scrapeURL(t, d.stageURL, "tandem:pipeline_kv_bytes_total", `op="write"`)
	if received <= 0 || read0+read1 != received || wrote0+wrote1 != received || read1 != wrote1 || read0*2 != read1*3 {
		t.Errorf("bytes: %v received; the prefill replica's stages read %v + %v, the decode replica's wrote %v + %v (want layers 3 and 2 of them)",
			received, read0, read1, wrote0, wrote1)
	}

	// A prefill replica of another split.
	p.leave(t, router, "p")
	p2 := startPipelineWorker(t, modelPath, "prefill", "p2", join, "--threads", "1", "--stage-layers", "1,4")
	router.wait(t, `worker joined[^\n]*worker=p2 `)
	sameTexts(t, "prefilled on a replica split 1,4", completeEach(t, base, 8, 2, maxTokens), want[8:])
	if n := scrapeURL(t, d.head.url, "tandem:kv_transfer_pulls_total", `result="ok"`); n != 10 {
		t.Errorf("good pulls %v after a replica of another split prefilled 2 more, want 10", n)
	}

	// A prefill replica that keeps its KV as f16: its blocks are not the decode replica's.
	p2.leave(t, router, "p2")
	p3 := startPipelineWorker(t, modelPath, "prefill", "p3", join, "--threads", "1", "--kv-type", "f16")
	router.wait(t, `worker joined[^\n]*worker=p3 `)
	sameTexts(t, "with only an f16 prefill replica, prefilled on the decode replica", completeEach(t, base, 10, 2, maxTokens), want[10:])
	if n := scrapeURL(t, base, "tandem_router:prefills_total", `where="local"`, `reason="kv_format_mismatch"`); n != 2 {
		t.Errorf("local prefills for the KV format: %v, want 2:\n%s", n, grepLines(router.text(), "prefill"))
	}
	if n := scrapeURL(t, p3.head.url, "tandem:prefill_only_requests_total"); n > 0 {
		t.Errorf("the f16 replica prefilled %v prompts that nobody could import", n)
	}
	if n := scrapeURL(t, d.head.url, "tandem:kv_transfer_pulls_total", `result="layout_mismatch"`); n > 0 {
		t.Errorf("pulls refused for their layout: %v, want none (the router pairs formats)", n)
	}
	if n := scrapeURL(t, d.head.url, "tandem:kv_transfer_pulls_total", `result="ok"`); n != 10 {
		t.Errorf("good pulls %v, want still 10", n)
	}
	logged := regexp.MustCompile(`no prefill worker stores KV blocks in this decode worker's format[^\n]*decode_worker=d [^\n]*kv_format="cpu-kv/1 f32[^\n]*prefill_formats="cpu-kv/1 f16`).FindAllString(router.text(), -1)
	if len(logged) != 1 {
		t.Errorf("the mismatch was logged %d times, want once, naming both formats:\n%s", len(logged), grepLines(router.text(), "format"))
	}
}

// TestPipelineDisaggregatedStageDies: stage 1 of a 2-stage prefill replica is SIGKILLed
// while the blocks of a long prompt stream to a 2-stage decode replica: the streamed
// request completes with the text the decode replica writes alone, the failure is counted,
// and no block is held afterwards.
func TestPipelineDisaggregatedStageDies(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a model and runs five processes")
	}
	modelPath := genModel(t, "mid.gguf", "--embd", "512", "--layers", "6", "--heads", "8", "--kv-heads", "4", "--ffn", "1024", "--ctx", "2048")
	router, base, join := startTestRouter(t, "--disagg-min-tokens", "64")
	p := startPipelineWorker(t, modelPath, "prefill", "p", join, "--threads", "1", "--max-batch-tokens", "64")
	d := startPipelineWorker(t, modelPath, "decode", "d", join, "--threads", "1")
	router.wait(t, `worker joined[^\n]*worker=p `)
	router.wait(t, `worker joined[^\n]*worker=d `)

	prompt := strings.Repeat("a long prompt that takes a while to read. ", 24) // about 1,000 byte-level tokens
	s := streamCompletion(base, prompt, 8)
	// Blocks are moving (stage 1 of the prefill replica read some) and the prefill goes on.
	deadline := time.Now().Add(90 * time.Second)
	for scrapeURL(t, p.stageURL, "tandem:pipeline_kv_bytes_total", `op="read"`) <= 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no block left the prefill replica:\n%s", p.head.log())
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.stage.cmd.Process.Signal(syscall.SIGKILL)
	prefilled := scrapeURL(t, p.head.url, "tandem:prefill_only_requests_total")
	<-s.done
	if s.err != nil {
		t.Fatalf("the request after the prefill stage died: %v", s.err)
	}
	want, err := complete1(d.head.url, prompt, 8)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.text.String(); got != want {
		t.Errorf("after the prefill stage died: %q, the decode replica alone %q", got, want)
	}
	failed := scrapeURL(t, d.head.url, "tandem:kv_transfer_pulls_total", `result="failed"`)
	fallbacks := scrapeURL(t, base, "tandem_router:remote_prefill_fallbacks_total", `stage="prefill"`)
	t.Logf("pulls failed %v, prefill fallbacks %v, prefills done when the stage died %v", failed, fallbacks, prefilled)
	if failed < 1 && fallbacks < 1 {
		t.Errorf("no failure counted: pulls failed %v, prefill fallbacks %v (prefills done when the stage died: %v)", failed, fallbacks, prefilled)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		used := scrapeURL(t, d.head.url, "tandem:kv_blocks_in_use")
		held := scrapeURL(t, p.head.url, "tandem:kv_held_prefills")
		if used == 0 && held <= 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%v KV blocks in use on the decode replica, %v prefills held on the prefill replica", used, held)
		}
	}
}
