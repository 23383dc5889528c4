package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"tandem/openai"
)

func startHardenedRouter(t *testing.T, extra ...string) *e2eRouter {
	args := append([]string{"--port", "0", "--orpc-port", "0", "--state-dir", t.TempDir(),
		"--join-token", e2eToken, "--heartbeat", "100ms", "--heartbeat-timeout", "3s"}, extra...)
	p := startProc(t, "tandem-router", "tandem-router", args...)
	url := p.wait(t, `tandem-router: (http://\S+)`, 60*time.Second)[1]
	addr := p.wait(t, `ORPC for engines: (\S+)`, 10*time.Second)[1]
	return &e2eRouter{proc: p, url: url, orpc: addr}
}

func request(t *testing.T, method, url, contentType, body string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
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

// TestRouterHardening, against a real tandem-router process with a real engine behind it:
// a body over the limit closes the connection (a request smuggled at offset limit+1 was
// answered), --api-key covers /tokenize, /detokenize and /metrics (--public-metrics opens
// /metrics, /health is open), slow bodies are cut, and non-JSON bodies get 415.
func TestRouterHardening(t *testing.T) {
	r := startHardenedRouter(t, "--api-key", "k3y", "--body-timeout", "500ms", "--min-body-rate", "1000")
	e := startEngineProc(t, "hard-1", r.orpc, e2eToken)
	e.wait(t, `tandem serve: http://`, 60*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _ := request(t, "GET", r.url+"/v1/models", "", "", "Authorization", "Bearer k3y")
		_, body := request(t, "GET", r.url+"/v1/models", "", "", "Authorization", "Bearer k3y")
		if code == 200 && strings.Contains(body, `"stories"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the engine never registered: %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}

	t.Run("smuggling", func(t *testing.T) {
		c, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(60 * time.Second))
		smuggled := "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\n\r\n"
		limit := openai.DefaultMaxBodyBytes
		bodyLen := limit + 1 + len(smuggled) + 1<<20
		go func() {
			w := bufio.NewWriterSize(c, 1<<16)
			fmt.Fprintf(w, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", bodyLen)
			w.WriteString(strings.Repeat("a", limit+1) + smuggled + strings.Repeat("b", bodyLen-limit-1-len(smuggled)))
			w.Flush()
		}()
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != 413 {
			t.Fatalf("status %d, want 413", resp.StatusCode)
		}
		if resp2, err := http.ReadResponse(br, nil); err == nil {
			t.Fatalf("a second response (%s) came: the bytes past the limit were parsed as a request", resp2.Status)
		}
	})

	t.Run("api-key", func(t *testing.T) {
		for _, tc := range []struct{ path, body string }{
			{"/tokenize", `{"model":"stories","prompt":"Hi"}`},
			{"/detokenize", `{"model":"stories","tokens":[72,105]}`},
		} {
			if code, body := request(t, "POST", r.url+tc.path, "application/json", tc.body); code != 401 {
				t.Errorf("%s without the key: %d %.300s", tc.path, code, body)
			}
			if code, body := request(t, "POST", r.url+tc.path, "application/json", tc.body, "Authorization", "Bearer k3y"); code != 200 {
				t.Errorf("%s with the key: %d %.300s", tc.path, code, body)
			}
		}
		if code, _ := request(t, "GET", r.url+"/metrics", "", ""); code != 401 {
			t.Errorf("/metrics without the key: %d", code)
		}
		if code, body := request(t, "GET", r.url+"/metrics", "", "", "Authorization", "Bearer k3y"); code != 200 || !strings.Contains(body, "tandem_router:http_requests_refused_total") {
			t.Errorf("/metrics with the key: %d, refusals counted: %v", code, strings.Contains(body, "refused"))
		}
		if code, _ := request(t, "GET", r.url+"/health", "", ""); code != 200 {
			t.Errorf("/health without the key: %d", code)
		}
		if code, body := request(t, "POST", r.url+"/v1/completions", "text/plain", `{"prompt":"Hi"}`, "Authorization", "Bearer k3y"); code != 415 {
			t.Errorf("text/plain body: %d %.300s", code, body)
		}
	})

	t.Run("slow-body", func(t *testing.T) {
		c, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(15 * time.Second))
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k3y\r\nContent-Type: application/json\r\nContent-Length: 2000\r\nExpect: 100-continue\r\n\r\n")
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		for err == nil && resp.StatusCode == http.StatusContinue {
			resp, err = http.ReadResponse(br, nil)
		}
		if err != nil || resp.StatusCode != 408 {
			t.Fatalf("a body that never came: %v %v, want 408", resp, err)
		}
	})

	public := startHardenedRouter(t, "--api-key", "k3y", "--public-metrics")
	if code, _ := request(t, "GET", public.url+"/metrics", "", ""); code != 200 {
		t.Errorf("--public-metrics: /metrics without the key: %d", code)
	}
}

// TestRouterDrainTellsClients: a SIGTERMed router answers /health 503 "draining" on new
// connections while it drains, and a stream its drain deadline cuts ends with an error
// event and [DONE] instead of just stopping.
func TestRouterDrainTellsClients(t *testing.T) {
	r := startHardenedRouter(t, "--drain-timeout", "2s")
	e := startProc(t, "slow-1", "tandem", "serve", "--backend", "sim", "--sim-profile", "cpu", "--port", "0",
		"--join", r.orpc, "--join-token", e2eToken, "--state-dir", t.TempDir(), "--node-name", "slow-1")
	e.wait(t, `tandem serve: http://`, 60*time.Second)
	r.wait(t, `worker joined`, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", r.url+"/v1/completions",
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
	r.cmd.Process.Signal(syscall.SIGTERM)
	deadline := time.Now().Add(1500 * time.Millisecond)
	for {
		fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
		hr, err := fresh.Get(r.url + "/health")
		if err == nil {
			b, _ := io.ReadAll(hr.Body)
			hr.Body.Close()
			if hr.StatusCode == 503 && string(b) == "draining\n" {
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
}

// TestStateDirOneProcess: a second engine on the state directory a live one holds exits at
// once with an error naming the holder (three engines started without --state-dir from one
// directory used to share one), and so does a second router.
func TestStateDirOneProcess(t *testing.T) {
	r := startHardenedRouter(t)
	state := t.TempDir()
	first := startProc(t, "engine-1", "tandem", "serve", "--backend", "sim", "--port", "0", "--join", r.orpc,
		"--join-token", e2eToken, "--state-dir", state, "--node-name", "one")
	first.wait(t, `tandem serve: http://`, 60*time.Second)
	second := startProc(t, "engine-2", "tandem", "serve", "--backend", "sim", "--port", "0", "--join", r.orpc,
		"--join-token", e2eToken, "--state-dir", state, "--node-name", "two")
	m, exited := second.logged(`is held by process \d+; give each process its own --state-dir`, 30*time.Second)
	if m == nil {
		t.Fatalf("the second engine did not refuse the held state directory (exited %v):\n%s", exited, second.text())
	}
	select {
	case <-second.exited:
		if second.err == nil {
			t.Error("the second engine exited 0")
		}
	case <-time.After(10 * time.Second):
		t.Error("the second engine did not exit")
	}
	routerDir := t.TempDir()
	a := startHardenedRouter(t, "--state-dir", routerDir)
	_ = a
	b := startProc(t, "tandem-router#2", "tandem-router", "--port", "0", "--orpc-port", "0", "--state-dir", routerDir)
	if m, _ := b.logged(`is held by process \d+`, 30*time.Second); m == nil {
		t.Errorf("a second router on a held state directory:\n%s", b.text())
	}
}
