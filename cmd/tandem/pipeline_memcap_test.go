package main

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// vmDataBytes is the data segment of process pid (VmData: its private writable mappings,
// what RLIMIT_DATA limits), in bytes.
func vmDataBytes(t *testing.T, pid int) int64 {
	t.Helper()
	n, err := procStatusBytes(pid, "VmData")
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestStagesServeUnderMemoryCap is the check that pipeline parallelism serves a
// model that does not fit one process's memory: every process runs under the same
// RLIMIT_DATA (prlimit --data), set between what one engine and what one stage of a
// 2-stage replica take of it, measured unlimited first (so the cap does not depend on the
// Go runtime's arena sizes or this machine). One engine must die under the cap; the two
// stages under it must serve one unlimited engine's text.
func TestStagesServeUnderMemoryCap(t *testing.T) {
	if testing.Short() {
		t.Skip("generates a 370 MB model and runs five processes")
	}
	prlimit, err := exec.LookPath("prlimit")
	if err != nil {
		t.Fatalf("prlimit (util-linux) is needed to cap a process's memory: %v", err)
	}
	bin, err := buildTandem()
	if err != nil {
		t.Fatal(err)
	}
	// 8 layers of 2048 (Q8_0, 367 MiB): the weights, packed on the heap, dominate a
	// process's data segment, so half of them is a difference the cap can see.
	modelPath := genModel(t, "big.gguf", "--embd", "2048", "--layers", "8", "--heads", "16", "--kv-heads", "4", "--ffn", "5632", "--ctx", "1024")
	common := []string{"--model", modelPath, "--served-model-name", "m", "--threads", "1", "--kv-cache-memory", "32MiB"}
	prompt := pipelinePrompts[1]

	// Unlimited: one engine, and a 2-stage replica; each process's data segment after a
	// completion (Go keeps what it mapped, so this is about its peak).
	one := startServe(t, append(common, "--itl-target", "0")...)
	want, err := complete1(one.url, prompt, 8)
	if err != nil {
		t.Fatal(err)
	}
	engineData := vmDataBytes(t, one.cmd.Process.Pid)
	one.cmd.Process.Kill()
	ca := filepath.Join(t.TempDir(), "ca")
	stage, addr := startStage(t, modelPath, 2, 1, "", ca, "--threads", "1")
	head := startServe(t, append(common, "--stages", "2", "--stage-next", addr, "--stage-ca", ca)...)
	if got, err := complete1(head.url, prompt, 8); err != nil || got != want {
		t.Fatalf("the unlimited replica: %q %v, one engine %q", got, err, want)
	}
	stageData := max(vmDataBytes(t, stage.cmd.Process.Pid), vmDataBytes(t, head.cmd.Process.Pid))
	head.cmd.Process.Kill()
	stage.cmd.Process.Kill()
	<-stage.done
	t.Logf("data segment: one engine %d MiB, the larger stage %d MiB", engineData>>20, stageData>>20)
	if engineData-stageData < 96<<20 {
		t.Fatalf("a stage takes %d MiB of data, one engine %d: too close for a cap between them", stageData>>20, engineData>>20)
	}
	limit := strconv.FormatInt((engineData+stageData)/2, 10)

	// One engine under the cap dies while it loads: the Go runtime fails to map memory
	// (an "out of memory" fatal error, or, as Go 1.26 sometimes has it, a fault in the
	// collector after the failed mapping).
	capped := exec.Command(prlimit, append([]string{"--data=" + limit, "--", bin, "serve", "--port", "0", "--itl-target", "0"}, common...)...)
	done := make(chan []byte, 1)
	go func() { b, _ := capped.CombinedOutput(); done <- b }()
	select {
	case out := <-done:
		if capped.ProcessState.Success() || strings.Contains(string(out), "tandem serve: http") {
			t.Errorf("one engine under a %s-byte data cap served: %v\n%s", limit, capped.ProcessState, out)
		}
	case <-time.After(90 * time.Second):
		capped.Process.Kill()
		t.Fatalf("one engine under a %s-byte data cap did not die", limit)
	}

	// The two stages under the same cap serve one engine's text.
	ca = filepath.Join(t.TempDir(), "ca")
	s1 := startCmd(t, exec.Command(prlimit, "--data="+limit, "--", bin, "serve", "--model", modelPath, "--served-model-name", "m",
		"--port", "0", "--threads", "1", "--stages", "2", "--stage", "1", "--stage-listen", "127.0.0.1:0", "--stage-ca", ca))
	addr = s1.wait(t, `link: (\S+) \(from stage`)[1]
	s0 := startCmd(t, exec.Command(prlimit, append([]string{"--data=" + limit, "--", bin, "serve", "--port", "0",
		"--stages", "2", "--stage-next", addr, "--stage-ca", ca}, common...)...))
	base := s0.wait(t, `tandem serve: (http://\S+)`)[1]
	if got, err := complete1(base, prompt, 8); err != nil || got != want {
		t.Errorf("the 2-stage replica under a %s-byte data cap: %q %v, one engine %q\nstage 0:\n%s\nstage 1:\n%s", limit, got, err, want, s0.text(), s1.text())
	}
}
