package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// The router binary stays pure Go and small: no hal, model or engine. (It
// reads model cards' tokenizers with gguf, a file-format package with no
// device code.)
func TestNoEngineDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		switch pkg {
		case "tandem/hal", "tandem/hal/cpu", "tandem/model", "tandem/engine", "tandem/modelgen":
			t.Errorf("tandem-router depends on %s", pkg)
		}
	}
}

func TestBadFlags(t *testing.T) {
	var stderr bytes.Buffer
	if err := run([]string{"--routing", "fastest"}, &stderr); err == nil || !strings.Contains(err.Error(), "unknown routing mode") {
		t.Errorf("--routing fastest: %v", err)
	}
	if err := run([]string{"extra"}, &stderr); err == nil {
		t.Error("a positional argument was accepted")
	}
	if err := run([]string{"--heartbeat", "1s", "--heartbeat-timeout", "1500ms"}, &stderr); err == nil || !strings.Contains(err.Error(), "under two heartbeat intervals") {
		t.Errorf("--heartbeat-timeout under two intervals: %v", err)
	}
	if err := run([]string{"--heartbeat", "0s"}, &stderr); err == nil || !strings.Contains(err.Error(), "positive interval") {
		t.Errorf("--heartbeat 0: %v", err)
	}
	if err := run([]string{"--sla-itl", "0s"}, &stderr); err == nil || !strings.Contains(err.Error(), "--sla-itl 0s") {
		t.Errorf("--sla-itl 0: %v", err)
	}
}
