package main

import (
	"bytes"
	"strings"
	"testing"
)

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
