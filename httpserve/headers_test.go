package httpserve

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

func do(t *testing.T, method, url string, header ...string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// Every response carries X-Request-Id: the client's when usable, else a new one, on the
// application's paths and the server's own.
func TestRequestID(t *testing.T) {
	s := start(t, Config{Handler: echo, Version: "v1"}, false)
	for _, path := range []string{"/x", HealthPath, VersionPath, MetricsPath} {
		if got := do(t, "GET", s.URL()+path, RequestIDHeader, "client-id-7").Header.Get(RequestIDHeader); got != "client-id-7" {
			t.Errorf("%s: the client's id came back as %q", path, got)
		}
		a, b := do(t, "GET", s.URL()+path).Header.Get(RequestIDHeader), do(t, "GET", s.URL()+path).Header.Get(RequestIDHeader)
		if len(a) != 24 || a == b {
			t.Errorf("%s: made ids %q, %q", path, a, b)
		}
	}
	for _, bad := range []string{strings.Repeat("x", 129), "has space"} {
		if got := do(t, "GET", s.URL()+"/x", RequestIDHeader, bad).Header.Get(RequestIDHeader); got == bad || len(got) != 24 {
			t.Errorf("unusable id %q came back as %q", bad, got)
		}
	}
}

// CORS is off by default; with allowed origins, their requests and preflights get the
// headers, and a preflight from another origin is refused and counted.
func TestCORS(t *testing.T) {
	off := start(t, Config{Handler: echo}, false)
	if r := do(t, "GET", off.URL()+"/x", "Origin", "http://a.test"); r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Error("CORS headers without --allowed-origins")
	}
	var refused []string
	s := start(t, Config{Handler: echo, AllowedOrigins: []string{"http://a.test"}, OnRefused: func(r string) { refused = append(refused, r) }}, false)
	r := do(t, "GET", s.URL()+"/x", "Origin", "http://a.test")
	if r.Header.Get("Access-Control-Allow-Origin") != "http://a.test" || !strings.Contains(r.Header.Get("Access-Control-Expose-Headers"), RequestIDHeader) || r.Header.Get("Vary") != "Origin" {
		t.Errorf("allowed origin: %v", r.Header)
	}
	r = do(t, "OPTIONS", s.URL()+"/v1/chat/completions", "Origin", "http://a.test", "Access-Control-Request-Method", "POST",
		"Access-Control-Request-Headers", "authorization, content-type")
	if r.StatusCode != http.StatusNoContent || r.Header.Get("Access-Control-Allow-Headers") != "authorization, content-type" ||
		!strings.Contains(r.Header.Get("Access-Control-Allow-Methods"), "POST") {
		t.Errorf("preflight: %d %v", r.StatusCode, r.Header)
	}
	if r := do(t, "GET", s.URL()+"/x", "Origin", "http://b.test"); r.StatusCode != 200 || r.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("other origin's request: %d %v", r.StatusCode, r.Header)
	}
	r = do(t, "OPTIONS", s.URL()+"/x", "Origin", "http://b.test", "Access-Control-Request-Method", "POST")
	if r.StatusCode != http.StatusForbidden || len(refused) != 1 || refused[0] != "cors_origin" {
		t.Errorf("other origin's preflight: %d, refusals %v", r.StatusCode, refused)
	}
	star := start(t, Config{Handler: echo, AllowedOrigins: []string{"*"}}, false)
	if r := do(t, "GET", star.URL()+"/x", "Origin", "http://c.test"); r.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Errorf("any origin: %v", r.Header)
	}
}
