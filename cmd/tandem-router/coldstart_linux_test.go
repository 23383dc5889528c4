package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestColdStartTable measures, for each model of TANDEM_COLDSTART (comma-separated GGUF
// paths), the time from starting tandem serve to the first token of a request, four ways:
// the model file with a cold page cache (posix_fadvise DONTNEED first), with a warm one,
// from the pack cache, and from a peer on loopback (the new engine's file cold, its content
// hash remembered from an earlier start); then the peer's decode speed while it sends. It
// prints a table of medians. It is a measurement, not a check: it asserts only that every
// start served, and is skipped unless asked for (it takes minutes).
func TestColdStartTable(t *testing.T) {
	models := os.Getenv("TANDEM_COLDSTART")
	if models == "" {
		t.Skip("a measurement of minutes: set TANDEM_COLDSTART=model.gguf[,...] (and TANDEM_COLDSTART_REPS, default 3) to run it")
	}
	reps := 3
	if n, err := strconv.Atoi(os.Getenv("TANDEM_COLDSTART_REPS")); err == nil && n > 0 {
		reps = n
	}
	var rows []string
	for _, model := range strings.Split(models, ",") {
		rows = append(rows, coldStartRow(t, model, reps))
	}
	t.Logf("time from process start to the first token, and the CPU time the new engine used, medians of %d:\n| model | cold disk | warm disk | pack cache | peer (loopback) |\n| --- | --- | --- | --- | --- |\n%s",
		reps, strings.Join(rows, "\n"))
}

// fadviseDontNeed drops path's pages from the page cache (those no process maps).
func fadviseDontNeed(t *testing.T, path string) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Sync()
	const posixFadvDontNeed = 4
	if _, _, e := syscall.Syscall6(syscall.SYS_FADVISE64, f.Fd(), 0, 0, posixFadvDontNeed, 0, 0); e != 0 {
		t.Fatalf("posix_fadvise: %v", e)
	}
}

func readAll(t *testing.T, path string) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	io.Copy(io.Discard, f)
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// firstToken starts tandem serve with args on a free port and returns the time from the
// start to the first streamed token of a one-token completion, and the process.
func firstToken(t *testing.T, name string, args ...string) (time.Duration, *proc) {
	t.Helper()
	if _, err := buildBins(); err != nil { // before the clock starts
		t.Fatal(err)
	}
	port := freePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	t0 := time.Now()
	p := startProc(t, name, "tandem", append([]string{"serve", "--port", strconv.Itoa(port), "--kv-cache-memory", "256MiB"}, args...)...)
	deadline := t0.Add(5 * time.Minute)
	for {
		if time.Now().After(deadline) {
			t.Fatalf("%s never served:\n%s", name, p.text())
		}
		select {
		case <-p.exited:
			t.Fatalf("%s exited:\n%s", name, p.text())
		default:
		}
		resp, err := http.Get(url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	body := `{"prompt":"Hello","max_tokens":1,"temperature":0,"stream":true}`
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), "data: {") {
			return time.Since(t0), p
		}
	}
	t.Fatalf("%s: no token streamed (%d)", name, resp.StatusCode)
	return 0, nil
}

// cpuSeconds is the user and system CPU time process pid has used (from /proc).
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The fields after the command name (which may hold spaces) in parentheses.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	sy, _ := strconv.ParseFloat(f[12], 64)
	return (u + sy) / 100 // USER_HZ
}

func kill(p *proc) {
	p.cmd.Process.Kill()
	<-p.exited
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func coldStartRow(t *testing.T, model string, reps int) string {
	base := filepath.Base(model)
	packDir := t.TempDir()
	measure := func(way string, before func(), args ...string) startTimes {
		var ds, cpus []time.Duration
		for i := range reps {
			before()
			d, p := firstToken(t, fmt.Sprintf("%s %s %d", base, way, i), append([]string{"--model", model}, args...)...)
			cpu := time.Duration(cpuSeconds(p.cmd.Process.Pid) * float64(time.Second))
			kill(p)
			ds, cpus = append(ds, d), append(cpus, cpu)
			t.Logf("%s %s: %.2fs (%.2f CPU s)", base, way, d.Seconds(), cpu.Seconds())
		}
		return startTimes{median(ds), median(cpus)}
	}
	cold := measure("cold disk", func() { fadviseDontNeed(t, model) })
	warm := measure("warm disk", func() { readAll(t, model) })
	// The pack cache: written by a first start, then mapped (its file warm).
	_, p := firstToken(t, base+" pack cache write", "--model", model, "--pack-cache", packDir)
	p.wait(t, `pack cache written`, 5*time.Minute)
	kill(p)
	cached := measure("pack cache", func() { readAll(t, model) }, "--pack-cache", packDir)

	// A peer: a router and engine a; b's state directory keeps its identity and its
	// content hash from a first, unmeasured start.
	r := startRouterProc(t)
	a := startProc(t, base+" a", "tandem", "serve", "--model", model, "--port", "0", "--kv-cache-memory", "256MiB",
		"--join", r.orpc, "--join-token", e2eToken, "--state-dir", t.TempDir(), "--node-name", "a")
	aURL := a.wait(t, `tandem serve: (http://\S+)`, 5*time.Minute)[1]
	aORPC := a.wait(t, `worker serving ORPC.* addr=(\S+)`, time.Minute)[1]
	a.wait(t, `registered with router`, time.Minute)
	bDir := t.TempDir()
	bArgs := []string{"--join", r.orpc, "--join-token", e2eToken, "--state-dir", bDir, "--node-name", "b",
		"--weights-from", aORPC, "--no-weight-peers"}
	_, b := firstToken(t, base+" peer first", append([]string{"--model", model}, bArgs...)...)
	b.wait(t, `weights: peer `, time.Minute)
	kill(b)
	peer := measure("peer", func() { fadviseDontNeed(t, model) }, bArgs...)

	// The peer's decode speed while it sends: a's tokens per second on a 64-token greedy
	// request, alone and with b pulling.
	alone := decodeRate(t, aURL)
	during := make(chan float64, 1)
	stop := make(chan struct{})
	go func() {
		var rates []float64
		for {
			select {
			case <-stop:
				slices.Sort(rates)
				if len(rates) == 0 {
					during <- 0
				} else {
					during <- rates[len(rates)/2]
				}
				return
			default:
			}
			rates = append(rates, decodeRate(t, aURL))
		}
	}()
	fadviseDontNeed(t, model)
	aCPU := cpuSeconds(a.cmd.Process.Pid)
	d, b := firstToken(t, base+" peer under load", append([]string{"--model", model}, bArgs...)...)
	close(stop)
	rate := <-during
	kill(b)
	t.Logf("%s: a decodes %.1f tokens/s alone, %.1f while b pulls (b started in %.2fs; a's CPU meanwhile, its requests included: %.2f s)",
		base, alone, rate, d.Seconds(), cpuSeconds(a.cmd.Process.Pid)-aCPU)
	// The sending alone: a's CPU time for one more pull, with no requests.
	aCPU = cpuSeconds(a.cmd.Process.Pid)
	_, b = firstToken(t, base+" peer send cost", append([]string{"--model", model}, bArgs...)...)
	kill(b)
	t.Logf("%s: a's CPU time to send the weights once: %.2f s", base, cpuSeconds(a.cmd.Process.Pid)-aCPU)
	kill(a)
	return fmt.Sprintf("| %s | %s | %s | %s | %s |", base, cold, warm, cached, peer)
}

// startTimes is a way's medians: time to first token, and the CPU time the process used.
type startTimes struct{ wall, cpu time.Duration }

func (s startTimes) String() string {
	return fmt.Sprintf("%.2f s (%.2f CPU s)", s.wall.Seconds(), s.cpu.Seconds())
}

// decodeRate is the tokens per second of a 64-token greedy completion on url (a short
// prompt: the time is nearly all decode). Not streamed: a random-weight model's tokens
// often have no text of their own, and a stream sends no event for them.
func decodeRate(t *testing.T, url string) float64 {
	body := `{"prompt":"Once upon a time","max_tokens":64,"temperature":0,"ignore_eos":true}`
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Logf("decode rate: %v", err)
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	took := time.Since(t0)
	var out struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &out) != nil {
		t.Logf("decode rate: %d %s", resp.StatusCode, b)
		return 0
	}
	return float64(out.Usage.CompletionTokens) / took.Seconds()
}
