package httpserve

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// bodyReader reads the whole body and reports how the read ended.
type bodyReader struct{ result chan error }

func (b bodyReader) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, err := io.ReadAll(r.Body)
	b.result <- err
	if err != nil {
		w.Header().Set("Connection", "close")
		http.Error(w, err.Error(), http.StatusRequestTimeout)
		return
	}
	fmt.Fprint(w, "ok")
}

// TestSlowBodyIsCut: a client that sends its headers and then a byte now and then, or
// Expect: 100-continue and no body, is cut after the body timeout (it was never cut), and
// a body that keeps up with the minimum rate is read whole.
func TestSlowBodyIsCut(t *testing.T) {
	const timeout = 300 * time.Millisecond
	h := bodyReader{result: make(chan error, 4)}
	s := start(t, Config{Handler: h, BodyReadTimeout: timeout, MinBodyRate: 1000}, false)
	addr := s.Addr().String()

	for _, tc := range []struct {
		name  string
		head  string
		trick func(c net.Conn) // what the client does after its headers
	}{
		{"trickle", "Content-Length: 1000\r\n", func(c net.Conn) {
			for range 20 {
				if _, err := c.Write([]byte("x")); err != nil {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
		}},
		{"expect-continue", "Content-Length: 1000\r\nExpect: 100-continue\r\n", func(net.Conn) {}},
		{"chunked-stall", "Transfer-Encoding: chunked\r\n", func(c net.Conn) { c.Write([]byte("5\r\nhello\r\n")) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(10 * time.Second))
			t0 := time.Now()
			fmt.Fprintf(c, "POST /upload HTTP/1.1\r\nHost: x\r\n%s\r\n", tc.head)
			go tc.trick(c)
			select {
			case err := <-h.result:
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("body read ended with %v, want a deadline error", err)
				}
				var bte *BodyTimeoutError
				if !errors.As(err, &bte) {
					t.Fatalf("%T is not a *BodyTimeoutError", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the slow body was never cut")
			}
			if took := time.Since(t0); took < timeout {
				t.Fatalf("cut after %v, before the %v timeout", took, timeout)
			}
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			for err == nil && resp.StatusCode == http.StatusContinue {
				resp, err = http.ReadResponse(br, nil)
			}
			if err != nil || resp.StatusCode != http.StatusRequestTimeout {
				t.Fatalf("response %v, %v; want 408", resp, err)
			}
		})
	}

	// 3,000 bytes at ~10 kB/s: within timeout + n/rate all the way.
	t.Run("steady", func(t *testing.T) {
		pr, pw := io.Pipe()
		go func() {
			for range 30 {
				pw.Write([]byte(strings.Repeat("y", 100)))
				time.Sleep(10 * time.Millisecond)
			}
			pw.Close()
		}()
		resp, err := http.Post(s.URL()+"/upload", "text/plain", pr)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if err := <-h.result; err != nil || resp.StatusCode != 200 {
			t.Fatalf("steady body: %d, %v", resp.StatusCode, err)
		}
	})
}

// TestMetricsToken: with MetricsToken, /metrics needs it; /health never does.
func TestMetricsToken(t *testing.T) {
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "m 1\n") })
	s := start(t, Config{Handler: echo, Metrics: metrics, MetricsToken: "k3y"}, false)
	do := func(path, auth string) int {
		req, _ := http.NewRequest("GET", s.URL()+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		path, auth string
		want       int
	}{
		{MetricsPath, "", 401},
		{MetricsPath, "Bearer nope", 401},
		{MetricsPath, "Bearer k3y", 200},
		{HealthPath, "", 200},
	} {
		if got := do(tc.path, tc.auth); got != tc.want {
			t.Errorf("%s with %q: %d, want %d", tc.path, tc.auth, got, tc.want)
		}
	}
}

// TestDrainDeadlineCause: when the drain deadline passes, a handler's context ends with
// ErrDrainTimeout as its cause, what it writes then reaches the client, and the response
// is still cut (no clean end; HTTP/3 excepted, see Server.abort).
func TestDrainDeadlineCause(t *testing.T) {
	for _, p := range protos {
		t.Run(p.name, func(t *testing.T) {
			causes := make(chan error, 1)
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprint(w, "data: 0\n\n")
				http.NewResponseController(w).Flush()
				<-r.Context().Done()
				causes <- context.Cause(r.Context())
				fmt.Fprint(w, "data: server ending\n\n")
			})
			s := start(t, Config{Handler: h}, p.tls)
			c := client(t, p)
			resp, err := c.Get(s.URL() + "/stream")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			if line, err := br.ReadString('\n'); err != nil || line != "data: 0\n" {
				t.Fatalf("first line %q, %v", line, err)
			}
			// The client reads as the data comes, as a streaming client does (QUIC drops
			// what is unread when the connection closes).
			type readAll struct {
				data []byte
				err  error
			}
			read := make(chan readAll, 1)
			go func() {
				var got []byte
				buf := make([]byte, 64)
				for {
					n, err := br.Read(buf)
					got = append(got, buf[:n]...)
					if err != nil {
						if err == io.EOF {
							err = nil
						}
						read <- readAll{got, err}
						return
					}
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			defer cancel()
			s.Shutdown(ctx)
			if cause := <-causes; !errors.Is(cause, ErrDrainTimeout) {
				t.Fatalf("cause %v, want ErrDrainTimeout", cause)
			}
			ra := <-read
			rest, err := ra.data, ra.err
			if !strings.Contains(string(rest), "data: server ending") {
				t.Errorf("the handler's last event did not arrive: %q (%v)", rest, err)
			}
			if err == nil && p.name != "h3" { // see Server.abort
				t.Errorf("the response ended cleanly; want it cut")
			}
		})
	}
}
