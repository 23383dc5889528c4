package live

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"tandem/httpserve"
	"tandem/openai"
)

// startLiveHTTP serves a live router's API (no workers) on 127.0.0.1:0.
func startLiveHTTP(t *testing.T) string {
	t.Helper()
	l := newTestRouter(t, Config{})
	srv, err := httpserve.New(httpserve.Config{Addr: "127.0.0.1:0", Handler: l.Handler(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(t.Context()) })
	return srv.Addr().String()
}

// drainStatus reads resp's body to its end and closes it, failing tb unless its status is
// want.
func drainStatus(tb testing.TB, resp *http.Response, want int) {
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		tb.Fatalf("status %d, want %d", resp.StatusCode, want)
	}
}

// TestOversizedBodyClosesConnection: a body over the API's limit gets a 413 and the
// connection closes, so the bytes past the limit are never parsed as requests (a request
// smuggled at offset limit+1 of the body went unanswered only once the router stopped
// reading bodies itself for the session id).
func TestOversizedBodyClosesConnection(t *testing.T) {
	addr := startLiveHTTP(t)
	smuggled := "GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
	limit := openai.DefaultMaxBodyBytes
	bodyLen := limit + 1 + len(smuggled) + 1<<20 // past the server's own post-handler discard
	for _, chunked := range []bool{false, true} {
		t.Run(fmt.Sprintf("chunked=%v", chunked), func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(30 * time.Second))
			head := "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
			if chunked {
				head += "Transfer-Encoding: chunked\r\n\r\n"
			} else {
				head += fmt.Sprintf("Content-Length: %d\r\n\r\n", bodyLen)
			}
			go func() {
				w := bufio.NewWriterSize(c, 1<<16)
				w.WriteString(head)
				body := []byte(strings.Repeat("a", limit+1) + smuggled + strings.Repeat("b", bodyLen-limit-1-len(smuggled)))
				if chunked {
					fmt.Fprintf(w, "%x\r\n", len(body))
					w.Write(body)
					w.WriteString("\r\n0\r\n\r\n")
				} else {
					w.Write(body)
				}
				w.Flush() // errors once the server closes: expected
			}()
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			drainStatus(t, resp, http.StatusRequestEntityTooLarge)
			if resp2, err := http.ReadResponse(br, nil); err == nil {
				t.Fatalf("a second response (%s) came on the connection: the bytes past the limit were parsed as a request", resp2.Status)
			}
		})
	}
}
