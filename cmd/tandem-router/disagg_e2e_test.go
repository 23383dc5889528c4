package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	sdk "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"tandem/internal/fixtures"
	"tandem/openai"
)

// disaggEngine is a tandem serve process in a disaggregated cluster.
type disaggEngine struct {
	*proc
	role, url string
}

type disaggCluster struct {
	r       *e2eRouter
	engines map[string]*disaggEngine
}

// startDisaggCluster starts a router (with extra flags) and the named engines serving model
// as "stories": names starting with p get --role prefill, with d --role decode; each gets
// engineArgs.
func startDisaggCluster(t *testing.T, model string, routerArgs []string, names []string, engineArgs ...string) *disaggCluster {
	t.Helper()
	args := append([]string{"--port", "0", "--orpc-port", "0", "--state-dir", t.TempDir(), "--join-token", e2eToken,
		"--heartbeat", "100ms", "--heartbeat-timeout", "3s", "--queue-timeout", "5s"}, routerArgs...)
	p := startProc(t, "tandem-router", "tandem-router", args...)
	r := &e2eRouter{proc: p, url: p.wait(t, `tandem-router: (http://\S+)`, 60*time.Second)[1], orpc: p.wait(t, `ORPC for engines: (\S+)`, 10*time.Second)[1]}
	c := &disaggCluster{r: r, engines: map[string]*disaggEngine{}}
	for _, name := range names {
		role := map[byte]string{'p': "prefill", 'd': "decode"}[name[0]]
		e := startProc(t, name, "tandem", append([]string{"serve", "--model", model,
			"--served-model-name", "stories", "--port", "0", "--join", r.orpc, "--join-token", e2eToken,
			"--state-dir", t.TempDir(), "--node-name", name, "--role", role, "--threads", "1"}, engineArgs...)...)
		c.engines[name] = &disaggEngine{proc: e, role: role}
	}
	for name, e := range c.engines {
		e.url = e.wait(t, `tandem serve: (http://\S+)`, 60*time.Second)[1]
		e.wait(t, `registered with router`, 30*time.Second)
		r.wait(t, `worker joined.*worker=`+name+` `, 10*time.Second)
	}
	return c
}

// metricValue scrapes url's /metrics for the sample of name whose labels include every
// given name="value" pair; -1 when absent.
func metricValue(t *testing.T, url, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return -1 // a killed process
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	rx := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	for _, m := range rx.FindAllStringSubmatch(string(body), -1) {
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(m[1], l)
		}
		if ok {
			v, _ := strconv.ParseFloat(m[2], 64)
			return v
		}
	}
	return -1
}

// counter is a counter's value, 0 before its first increment.
func counter(t *testing.T, url, name string, labels ...string) float64 {
	return max(0, metricValue(t, url, name, labels...))
}

// waitBaseline waits until every live engine holds no KV block and no prefill hold.
func (c *disaggCluster) waitBaseline(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for name, e := range c.engines {
		for c.alive(e) {
			used := metricValue(t, e.url, "tandem:kv_blocks_in_use")
			held := metricValue(t, e.url, "tandem:kv_held_prefills")
			if used == 0 && held == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %v KV blocks in use, %v prefills held: not back to baseline", name, used, held)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func (c *disaggCluster) alive(e *disaggEngine) bool {
	select {
	case <-e.exited:
		return false
	default:
		return true
	}
}

// tokenize returns the prompt's token ids on engine url.
func tokenize(t *testing.T, url, text string) []int32 {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": "stories", "prompt": text})
	resp, err := http.Post(url+"/tokenize", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct{ Tokens []int32 }
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out.Tokens
}

// prompts of the disaggregated tests: about 67 tokens, well above --disagg-min-tokens (32)
// and short enough for the fixture's 128-token context with room for 50 more.
func longPrompt(i int) string {
	return fmt.Sprintf("Story %d. ", i) + strings.Repeat("Lily and Ben played in the park with a big red ball. ", 3)
}

// One router, two prefill and two decode engines (real processes): a long prompt is
// prefilled on a prefill engine and decoded on a decode engine with exactly the greedy
// tokens of one engine doing both; a prefix the decode engine holds is not transferred
// again; SIGKILL of a prefill engine mid-transfer and of a decode engine mid-decode still
// completes every request correctly; KV usage returns to its baseline after each.
func TestDisaggregatedEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs five processes")
	}
	// 100 KB/s: a prompt's 5 or 6 blocks of 10 KiB take about half a second to move, so a
	// test can act in the middle of a transfer.
	c := startDisaggCluster(t, fixtures.Model(t, "stories260K-f32.gguf"), []string{"--disagg-min-tokens", "32"}, []string{"p1", "p2", "d1", "d2"}, "--kv-send-rate", "100KB")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rc := sdkClient(c.r.url)
	// References: a sixth engine, on its own (aggregated: prefill and decode together).
	agg := startProc(t, "aggregated", "tandem", "serve", "--model", fixtures.Model(t, "stories260K-f32.gguf"),
		"--served-model-name", "stories", "--port", "0", "--threads", "1")
	aggURL := agg.wait(t, `tandem serve: (http://\S+)`, 60*time.Second)[1]
	ref := func(t *testing.T, prompt string, maxTokens int, opts ...option.RequestOption) *sdk.Completion {
		t.Helper()
		out, _, err := completion(ctx, sdkClient(aggURL), prompt, maxTokens, opts...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	c.waitBaseline(t)

	t.Run("greedy tokens equal aggregated", func(t *testing.T) {
		for i := range 3 {
			prompt := longPrompt(i)
			want := ref(t, prompt, 40)
			got, wk, err := completion(ctx, rc, prompt, 40)
			if err != nil {
				t.Fatal(err)
			}
			if got.Choices[0].Text != want.Choices[0].Text || got.Usage.CompletionTokens != want.Usage.CompletionTokens ||
				got.Usage.PromptTokens != want.Usage.PromptTokens {
				t.Errorf("prompt %d: disaggregated %q (%+v), aggregated %q (%+v)", i, got.Choices[0].Text, got.Usage, want.Choices[0].Text, want.Usage)
			}
			if ws := strings.Split(wk, ","); len(ws) != 2 || c.engines[ws[0]].role != "prefill" || c.engines[ws[1]].role != "decode" {
				t.Errorf("prompt %d served by %q: want a prefill then a decode engine", i, wk)
			}
		}
		if n := counter(t, c.r.url, "tandem_router:prefills_total", `where="remote"`); n != 3 {
			t.Errorf("remote prefills %v, want 3", n)
		}
		// A short prompt is prefilled where it is decoded.
		got, wk, err := completion(ctx, rc, "The cat sat", 16)
		if err != nil {
			t.Fatal(err)
		}
		if want := ref(t, "The cat sat", 16); got.Choices[0].Text != want.Choices[0].Text || (wk != "d1" && wk != "d2") {
			t.Errorf("short prompt: %q from %q, want %q from one decode engine", got.Choices[0].Text, wk, want.Choices[0].Text)
		}
		if n := counter(t, c.r.url, "tandem_router:prefills_total", `where="local"`, `reason="uncached_below_threshold"`); n != 1 {
			t.Errorf("local prefills below the threshold: %v, want 1", n)
		}
		c.waitBaseline(t)
	})

	t.Run("only missing blocks move", func(t *testing.T) {
		a := "Tim had a little boat. He sailed it on the pond every day. "                    // about 35 tokens: 2 full blocks
		ab := a + "One day the wind was strong and the boat went far away. Tim ran after it." // about 75
		_, wk, err := completion(ctx, rc, a, 8)
		if err != nil {
			t.Fatal(err)
		}
		d := strings.Split(wk, ",")[len(strings.Split(wk, ","))-1]
		de := c.engines[d]
		waitRouterSees(t, c.r.url, d, len(tokenize(t, de.url, a))/16) // a's full blocks, from d's KV events
		before := counter(t, de.url, "tandem:kv_transfer_blocks_total", `direction="received"`)
		got, wk2, err := completion(ctx, rc, ab, 8)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasSuffix(wk2, ","+d) {
			t.Fatalf("the longer prompt went to %q; its prefix is on %s", wk2, d)
		}
		if want := ref(t, ab, 8); got.Choices[0].Text != want.Choices[0].Text {
			t.Errorf("%q, want %q", got.Choices[0].Text, want.Choices[0].Text)
		}
		ta, tab := tokenize(t, de.url, a), tokenize(t, de.url, ab)
		common := 0
		for common < len(ta) && common < len(tab) && ta[common] == tab[common] {
			common++
		}
		had := min(len(ta)/16, common/16) // a's full blocks that ab shares
		want := float64(len(tab)/16 - had)
		if got := counter(t, de.url, "tandem:kv_transfer_blocks_total", `direction="received"`) - before; got != want {
			t.Errorf("%s received %v blocks for the longer prompt, want %v (%d full blocks, %d held)", d, got, want, len(tab)/16, had)
		}
		c.waitBaseline(t)
	})

	t.Run("SIGKILL of P mid-transfer", func(t *testing.T) {
		prompt := longPrompt(10)
		want := ref(t, prompt, 24)
		sent := map[string]float64{}
		for _, p := range []string{"p1", "p2"} {
			sent[p] = counter(t, c.engines[p].url, "tandem:kv_transfer_blocks_total", `direction="sent"`)
		}
		// The decode worker whose pull fails may not be the one that answers: with nothing
		// sent to the client yet, the router may dispatch the request afresh (the header
		// then names that worker alone). So failed pulls are counted over both.
		failedPulls := func() float64 {
			n := 0.0
			for _, d := range []string{"d1", "d2"} {
				u := c.engines[d].url
				n += counter(t, u, "tandem:kv_transfer_pulls_total", `result="failed"`) + counter(t, u, "tandem:kv_transfer_pulls_total", `result="timeout"`)
			}
			return n
		}
		failedBefore := failedPulls()
		type result struct {
			out *sdk.Completion
			wk  string
			err error
		}
		done := make(chan result, 1)
		go func() {
			out, wk, err := completion(ctx, rc, prompt, 24)
			done <- result{out, wk, err}
		}()
		killed := ""
		deadline := time.Now().Add(30 * time.Second)
		for killed == "" && time.Now().Before(deadline) {
			for _, p := range []string{"p1", "p2"} {
				if counter(t, c.engines[p].url, "tandem:kv_transfer_blocks_total", `direction="sent"`) > sent[p] {
					c.engines[p].cmd.Process.Signal(syscall.SIGKILL)
					killed = p
					break
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		if killed == "" {
			t.Fatal("no prefill engine started sending blocks")
		}
		res := <-done
		if res.err != nil {
			t.Fatalf("after killing %s mid-transfer: %v", killed, res.err)
		}
		if res.out.Choices[0].Text != want.Choices[0].Text {
			t.Errorf("after killing %s mid-transfer: %q, want %q", killed, res.out.Choices[0].Text, want.Choices[0].Text)
		}
		if ws := strings.Split(res.wk, ","); c.engines[ws[len(ws)-1]] == nil || c.engines[ws[len(ws)-1]].role != "decode" {
			t.Errorf("served by %q, want a decode worker last", res.wk)
		}
		if n := failedPulls() - failedBefore; n < 1 {
			t.Errorf("the decode workers counted no failed pull after %s was killed (served by %q)", killed, res.wk)
		}
		<-c.engines[killed].exited
		c.waitBaseline(t)
		c.r.wait(t, `worker left.*worker=`+killed+` `, 15*time.Second)
	})

	t.Run("SIGKILL of D mid-decode", func(t *testing.T) {
		prompt := longPrompt(20)
		ignoreEOS := option.WithJSONSet("ignore_eos", true)
		const maxTokens = 50
		want := ref(t, prompt, maxTokens, ignoreEOS)
		migrations := counter(t, c.r.url, "tandem_router:migrations_total")
		var resp *http.Response
		stream := rc.Completions.NewStreaming(ctx, sdk.CompletionNewParams{Model: "stories",
			Prompt:      sdk.CompletionNewParamsPromptUnion{OfString: sdk.String(prompt)},
			Temperature: sdk.Float(0), MaxTokens: sdk.Int(maxTokens)}, ignoreEOS, option.WithResponseInto(&resp))
		var text strings.Builder
		killed := ""
		chunks := 0
		for stream.Next() {
			for _, ch := range stream.Current().Choices {
				text.WriteString(ch.Text)
			}
			chunks++
			if killed == "" && chunks == 2 { // the first token came from P, the second from D
				ws := strings.Split(resp.Header.Get(openai.WorkerHeader), ",")
				killed = ws[len(ws)-1]
				if e := c.engines[killed]; e == nil || e.role != "decode" {
					t.Fatalf("X-Tandem-Worker %q", resp.Header.Get(openai.WorkerHeader))
				}
				c.engines[killed].cmd.Process.Signal(syscall.SIGKILL)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatalf("stream after killing %s: %v", killed, err)
		}
		if text.String() != want.Choices[0].Text {
			t.Errorf("after killing %s mid-decode: %q, want %q", killed, text.String(), want.Choices[0].Text)
		}
		if n := counter(t, c.r.url, "tandem_router:migrations_total"); n <= migrations {
			t.Logf("no migration counted: %s had finished before it died", killed)
		}
		<-c.engines[killed].exited
		c.waitBaseline(t)
	})

	t.Run("requests after the losses", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				prompt := longPrompt(30 + i)
				got, _, err := completion(ctx, rc, prompt, 16)
				if err != nil {
					t.Error(err)
					return
				}
				if want := ref(t, prompt, 16); got.Choices[0].Text != want.Choices[0].Text {
					t.Errorf("prompt %d: %q, want %q", i, got.Choices[0].Text, want.Choices[0].Text)
				}
			}()
		}
		wg.Wait()
		c.waitBaseline(t)
	})
}

// genModel writes a random-weight model big enough that a long prompt's prefill takes a
// while on one thread (about 2 s for 1,000 tokens here): 12 layers, 768 wide, q8_0.
func genModel(t *testing.T) string {
	t.Helper()
	dir, err := buildBins()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "mid.gguf")
	cmd := exec.Command(filepath.Join(dir, "tandem"), "gen-model", "--preset", "demo", "--embd", "768", "--layers", "12",
		"--heads", "12", "--kv-heads", "4", "--ffn", "2048", "--ctx", "2048", "--type", "q8_0", "--out", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("gen-model: %v\n%s", err, b)
	}
	return out
}

// SIGKILL of the prefill engine in the middle of a long prefill: the router's call to it
// fails, the decode engine prefills the prompt itself, and the request completes with the
// tokens of an uninterrupted run; the decode engine's KV usage returns to its baseline.
func TestDisaggregatedPrefillEngineDies(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three processes")
	}
	c := startDisaggCluster(t, genModel(t), []string{"--disagg-min-tokens", "64"}, []string{"p1", "d1"}, "--max-batch-tokens", "64")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	prompt := strings.Repeat("a long prompt that takes a while to read. ", 24) // about 1,000 byte-level tokens
	type result struct {
		out *sdk.Completion
		wk  string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, wk, err := completion(ctx, sdkClient(c.r.url), prompt, 8)
		done <- result{out, wk, err}
	}()
	p := c.engines["p1"]
	deadline := time.Now().Add(60 * time.Second)
	for metricValue(t, p.url, "tandem:num_requests_running") < 1 {
		if time.Now().After(deadline) {
			t.Fatal("the prefill engine never started the request")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := counter(t, p.url, "tandem:prefill_only_requests_total"); n != 0 {
		t.Fatalf("the prefill finished (%v) before it could be interrupted", n)
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	res := <-done
	if res.err != nil {
		t.Fatalf("after killing the prefill engine mid-prefill: %v", res.err)
	}
	if res.wk != "d1" {
		t.Errorf("served by %q, want d1 alone", res.wk)
	}
	want, _, err := completion(ctx, sdkClient(c.engines["d1"].url), prompt, 8)
	if err != nil {
		t.Fatal(err)
	}
	if res.out.Choices[0].Text != want.Choices[0].Text {
		t.Errorf("after the prefill engine died: %q, want %q", res.out.Choices[0].Text, want.Choices[0].Text)
	}
	if n := counter(t, c.r.url, "tandem_router:remote_prefill_fallbacks_total", `stage="prefill"`); n != 1 {
		t.Errorf("prefill fallbacks %v, want 1", n)
	}
	if n := counter(t, c.r.url, "tandem_router:prefills_total", `where="local"`, `reason="prefill_failed"`); n != 1 {
		t.Errorf("local prefills after a failure: %v, want 1", n)
	}
	c.waitBaseline(t)
}
