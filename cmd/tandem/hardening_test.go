package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// procStatusBytes reads a "NAME:  N kB" field of /proc/PID/status in bytes.
func procStatusBytes(pid int, name string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	m := regexp.MustCompile(`(?m)^` + name + `:\s+(\d+) kB`).FindSubmatch(b)
	if m == nil {
		return 0, fmt.Errorf("no %s in /proc/%d/status", name, pid)
	}
	kb, err := strconv.ParseInt(string(m[1]), 10, 64)
	return kb << 10, err
}

// peakRSS reads a process's peak resident memory (VmHWM) in bytes.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	n, err := procStatusBytes(pid, "VmHWM")
	if err != nil {
		t.Skipf("no peak memory of the server to read: %v", err)
	}
	return n
}

func post(t *testing.T, url, contentType, body string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeHugePromptBoundedMemory: prompts far longer than the context (31 MB alone,
// then three of 16 MB at once) get a 400 without being tokenized whole. Tokenized whole,
// the 31 MB prompt alone took the demo model's server to about 2 GB.
func TestServeHugePromptBoundedMemory(t *testing.T) {
	s := startServe(t)
	huge := func(n int) string {
		b, _ := json.Marshal(map[string]any{"prompt": strings.Repeat("All work and no play. ", n/22), "max_tokens": 1})
		return string(b)
	}
	code, body := post(t, s.url+"/v1/completions", "application/json", huge(31<<20))
	if code != 400 || !strings.Contains(body, "context_length_exceeded") {
		t.Fatalf("31 MB prompt: %d %.300s", code, body)
	}
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			b, _ := json.Marshal(map[string]any{"max_tokens": 1, "messages": []map[string]string{
				{"role": "user", "content": strings.Repeat("All work and no play. ", 16<<20/22)}}})
			code, body := post(t, s.url+"/v1/chat/completions", "application/json", string(b))
			if code != 400 || !strings.Contains(body, "context_length_exceeded") {
				t.Errorf("16 MB chat message: %d %.200s", code, body)
			}
		})
	}
	wg.Wait()
	const limit = 700 << 20
	peak := peakRSS(t, s.cmd.Process.Pid)
	t.Logf("peak resident memory: %d MiB", peak>>20)
	if peak > limit {
		t.Errorf("peak resident memory %d MiB, want under %d MiB", peak>>20, limit>>20)
	}
	// /tokenize has no context to stop at: its body is bounded instead.
	code, body = post(t, s.url+"/tokenize", "application/json", huge(2<<20))
	if code != 413 {
		t.Errorf("2 MB /tokenize: %d %.200s", code, body)
	}
}

// TestServeSlowBodies: a body that trickles in, or never comes after
// Expect: 100-continue, is cut after --body-timeout (200 of 200 such connections were
// still open after 45 s before).
func TestServeSlowBodies(t *testing.T) {
	s := startServe(t, "--body-timeout", "500ms", "--min-body-rate", "1000")
	addr := strings.TrimPrefix(s.url, "http://")
	for name, head := range map[string]string{
		"trickle":         "Content-Length: 2000\r\n",
		"expect-continue": "Content-Length: 2000\r\nExpect: 100-continue\r\n",
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(15 * time.Second))
			fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s\r\n", head)
			if name == "trickle" {
				go func() {
					for range 50 {
						if _, err := c.Write([]byte(" ")); err != nil {
							return
						}
						time.Sleep(200 * time.Millisecond)
					}
				}()
			}
			t0 := time.Now()
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			for err == nil && resp.StatusCode == http.StatusContinue {
				resp, err = http.ReadResponse(br, nil)
			}
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 408 || !strings.Contains(string(b), "request_timeout") {
				t.Fatalf("%d %s, want 408", resp.StatusCode, b)
			}
			if took := time.Since(t0); took > 5*time.Second {
				t.Errorf("cut after %v", took)
			}
			if _, err := br.ReadByte(); err == nil {
				t.Error("the connection stayed open after the 408")
			}
		})
	}
	if _, body := get(t, s.url+"/metrics"); !strings.Contains(body, `tandem:http_requests_refused_total{reason="body_timeout"} 2`) {
		t.Errorf("the cut bodies are not counted:\n%s", grepLines(body, "refused"))
	}
}

// TestServeAPIKeyCoversEverything: with --api-key, /tokenize, /detokenize and /metrics
// need the key (they answered without one); /health does not; --public-metrics opens
// /metrics again. A body that is not JSON gets 415.
func TestServeAPIKeyCoversEverything(t *testing.T) {
	for _, public := range []bool{false, true} {
		t.Run(fmt.Sprintf("public-metrics=%v", public), func(t *testing.T) {
			args := []string{"--api-key", "k3y"}
			if public {
				args = append(args, "--public-metrics")
			}
			s := startServe(t, args...)
			for _, tc := range []struct{ path, body string }{
				{"/tokenize", `{"prompt":"Hi"}`},
				{"/detokenize", `{"tokens":[72,105]}`},
				{"/v1/completions", `{"prompt":"Hi","max_tokens":1}`},
			} {
				if code, body := post(t, s.url+tc.path, "application/json", tc.body); code != 401 {
					t.Errorf("%s without the key: %d %.300s", tc.path, code, body)
				}
				if code, body := post(t, s.url+tc.path, "application/json", tc.body, "Authorization", "Bearer k3y"); code != 200 {
					t.Errorf("%s with the key: %d %.300s", tc.path, code, body)
				}
			}
			if code, _ := get(t, s.url+"/health"); code != 200 {
				t.Errorf("/health without a key: %d", code)
			}
			wantMetrics := 401
			if public {
				wantMetrics = 200
			}
			if code, _ := get(t, s.url+"/metrics"); code != wantMetrics {
				t.Errorf("/metrics without a key: %d, want %d", code, wantMetrics)
			}
			for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded"} {
				code, body := post(t, s.url+"/v1/completions", ct, `{"prompt":"Hi","max_tokens":1}`, "Authorization", "Bearer k3y")
				if code != 415 || !strings.Contains(body, "application/json") {
					t.Errorf("Content-Type %s: %d %.300s", ct, code, body)
				}
			}
		})
	}
}

// TestServeDrainTellsClients: during a drain /health answers 503 on a new connection
// (it was refused), and a stream the drain deadline cuts ends with an error event and
// [DONE] (it ended with neither).
func TestServeDrainTellsClients(t *testing.T) {
	s := startServe(t, "--backend", "sim", "--sim-profile", "cpu", "--drain-timeout", "2s")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/completions",
		strings.NewReader(`{"prompt":"Hello","max_tokens":2000,"stream":true}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	if !sc.Scan() {
		t.Fatalf("no first event: %v", sc.Err())
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(1500 * time.Millisecond)
	for {
		fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		r, err := fresh.Get(s.url + "/health")
		if err == nil {
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode == 503 && string(b) == "draining\n" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/health during the drain: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var last []string
	for sc.Scan() {
		if line := sc.Text(); line != "" {
			last = append(last, line)
		}
	}
	if len(last) < 2 || !strings.Contains(last[len(last)-2], `"code":"server_shutdown"`) || last[len(last)-1] != "data: [DONE]" {
		t.Fatalf("the cut stream ended with %q", last[max(0, len(last)-2):])
	}
	select {
	case err := <-s.exited:
		if err != nil {
			t.Errorf("exit: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Error("still running after its drain deadline")
	}
}
