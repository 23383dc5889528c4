package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPlanCmd(t *testing.T) {
	// One user at a time: one conversation of 20 turns, 5 s apart.
	var stdout, stderr bytes.Buffer
	if err := planCmd([]string{"--workload", "multi-turn", "--multi-turn-turns", "20", "--startup", "0"}, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	out := stdout.String()
	if !strings.Contains(out, "Verdict: one engine is enough") {
		t.Errorf("one user at a time: want one engine:\n%s", out)
	}
	for _, want := range []string{"Workload: 20 requests", "fixed aggregated, smallest meeting the SLA at peak", "planner, disaggregated", "Recommended pool sizes over time"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}

	// A ramp that needs several engines at its peak and fewer around it.
	stdout.Reset()
	js := filepath.Join(t.TempDir(), "plan.json")
	args := []string{"--workload", "ramp", "--ramp-base-rate", "3", "--ramp-hold", "1m", "--ramp-up", "3m", "--ramp-input-len", "4000",
		"--ramp-output-len", "100", "--interval", "30s", "--startup", "0,30s", "--mode", "aggregated", "--json-out", js}
	if err := planCmd(args, &stdout, &stderr); err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	out = stdout.String()
	if !strings.Contains(out, "Verdict: several aggregated engines behind the router") || !strings.Contains(out, "start-up 30s") {
		t.Errorf("ramp:\n%s", out)
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Verdict string
		Runs    []struct {
			Name          string
			Planner       bool
			Hindsight     bool
			WorkerSeconds float64 `json:"worker_seconds"`
			Attainment    float64
		}
		Timeline struct{ Points []map[string]any }
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var fixed, planned float64
	var hindsight []float64
	for _, r := range m.Runs {
		if r.Hindsight {
			hindsight = append(hindsight, r.WorkerSeconds)
		}
		switch r.Name {
		case "fixed aggregated, smallest meeting the SLA at peak":
			fixed = r.WorkerSeconds
		case "planner, aggregated":
			planned = r.WorkerSeconds
			if r.Attainment < 0.95 {
				t.Errorf("the planner's attainment %.3f", r.Attainment)
			}
		}
	}
	if fixed == 0 || planned == 0 || planned >= fixed {
		t.Errorf("worker-seconds: fixed peak pool %.0f, planner %.0f: want the planner cheaper", fixed, planned)
	}
	// The pools sized in hindsight: each window's smallest, and the cheapest per interval.
	if len(hindsight) != 2 || hindsight[0] > fixed || hindsight[1] > fixed || !strings.Contains(out, "hindsight: cheapest 30s sizes meeting it overall") {
		t.Errorf("hindsight runs %v against the fixed pool's %.0f worker-seconds:\n%s", hindsight, fixed, out)
	}
	if len(m.Timeline.Points) == 0 || !strings.HasPrefix(m.Verdict, "several aggregated") {
		t.Errorf("JSON: %d timeline points, verdict %q", len(m.Timeline.Points), m.Verdict)
	}

	for _, bad := range [][]string{
		{}, {"--workload", "nope"}, {"--workload", "ramp", "--sla-ttft", "0"}, {"--workload", "ramp", "--goal", "1"},
		{"--workload", "ramp", "--startup", "soon"}, {"--workload", "ramp", "--mode", "both-ways"},
		{"--workload", "ramp", "--predictor", "prophet"}, {"--workload", "ramp", "--ramp-factor", "0.5"},
	} {
		if err := planCmd(bad, &stdout, &stderr); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
