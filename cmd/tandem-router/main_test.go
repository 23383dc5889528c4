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

func TestBadPlannerConnectorFlags(t *testing.T) {
	t.Setenv("TANDEM_K8S_CLUSTER", "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--planner", "--planner-connector", "ssh"}, "want local or kubernetes"},
		{[]string{"--planner", "--planner-connector", "kubernetes"}, "needs --planner-k8s-cluster"},
		{[]string{"--planner", "--planner-connector", "kubernetes", "--planner-k8s-cluster", "c", "--port", "0", "--orpc-port", "0", "--state-dir", t.TempDir()}, "not in a pod"},
	} {
		var stderr bytes.Buffer
		if err := run(tc.args, &stderr); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error saying %q", tc.args, err, tc.want)
		}
	}
}
