package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseITLTarget(t *testing.T) {
	for _, c := range []struct {
		in   string
		want itlTarget
		ok   bool
	}{
		{"2.5x", itlTarget{decodes: 2.5}, true}, {"100ms", itlTarget{abs: 100 * time.Millisecond}, true},
		{"0", itlTarget{}, true}, {"none", itlTarget{}, true},
		{"0.5x", itlTarget{}, false}, {"x", itlTarget{}, false}, {"-1s", itlTarget{}, false}, {"fast", itlTarget{}, false},
	} {
		x, err := parseITLTarget(c.in)
		if (err == nil) != c.ok || x != c.want {
			t.Errorf("%q: %+v, %v; want %+v (ok %v)", c.in, x, err, c.want, c.ok)
		}
	}
	var stdout, stderr bytes.Buffer
	for _, args := range [][]string{{"--itl-target", "-5ms"}, {"--step-profile", "/nonexistent/profile.json"}} {
		flag := args[0]
		if err := serveCmd(append(args, "--port", "0"), &stdout, &stderr); err == nil || !strings.Contains(err.Error(), flag) {
			t.Errorf("serve %v: %v, want an error naming %s", args, err, flag)
		}
	}
}

// tandem simulate schedules with the engine's ITL target: the tail of the inter-token
// latency shrinks to the target, and the steps over it are reported.
func TestSimulateITLTarget(t *testing.T) {
	dir := t.TempDir()
	timing := filepath.Join(dir, "timing.json")
	// Roughly a 0.5B model on 2 cores (tandem profile of Qwen2.5-0.5B's shape, Q8_0).
	if err := os.WriteFile(timing, []byte(`{"prefill_base_ms": 10, "prefill_per_token_ms": 1.4, "prefill_per_token2_ms": 0.001,
		"decode_base_ms": 20, "decode_per_seq_ms": 1.2, "decode_per_kv_token_ms": 0.002}`), 0o644); err != nil {
		t.Fatal(err)
	}
	p99 := map[string]float64{}
	for _, itl := range []string{"0", "2.5x"} {
		out := filepath.Join(dir, "out-"+itl+".json")
		var stdout, stderr bytes.Buffer
		if err := simulateCmd([]string{"--workload", "multi-turn", "--multi-turn-conversations", "4", "--multi-turn-turns", "2",
			"--multi-turn-input-len", "256", "--multi-turn-output-len", "64", "--request-rate", "inf", "--workers", "1",
			"--timing", timing, "--max-num-batched-tokens", "512", "--itl-target", itl, "--json-out", out}, &stdout, &stderr); err != nil {
			t.Fatalf("--itl-target %s: %v\n%s", itl, err, stderr.String())
		}
		if got := strings.Contains(stdout.String(), "Steps over the ITL target:"); got != (itl != "0") {
			t.Errorf("--itl-target %s: the table reports steps over the target %v:\n%s", itl, got, stdout.String())
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		var m struct {
			P99ITL float64 `json:"p99_itl_ms"`
			Config struct {
				Decodes float64 `json:"itl_target_decodes"`
			} `json:"sim_config"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		p99[itl] = m.P99ITL
		if want := map[string]float64{"0": 0, "2.5x": 2.5}[itl]; m.Config.Decodes != want {
			t.Errorf("--itl-target %s: target %v times the decodes in the report, want %v", itl, m.Config.Decodes, want)
		}
	}
	// A 256-token prompt alone takes ≈ 400 ms; under the target no step with decodes takes
	// more than 2.5 times its decodes, which for 4 streams take at most 30 ms.
	if p99["0"] < 300 || p99["2.5x"] > 75 {
		t.Errorf("p99 ITL %.0f ms without a target, %.0f ms with 2.5x", p99["0"], p99["2.5x"])
	}
}
