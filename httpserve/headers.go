package httpserve

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"slices"
	"strings"
)

// RequestIDHeader names every response: the client's own id when it sent a usable one,
// else a new one, so that a client's log and the server's agree.
const RequestIDHeader = "X-Request-Id"

// maxRequestID bounds an id taken from a client.
const maxRequestID = 128

// RequestID is the request's id: the client's X-Request-Id when it is 1 to 128 printable
// ASCII characters, else 24 random hex digits.
func RequestID(r *http.Request) string {
	if id := r.Header.Get(RequestIDHeader); id != "" && len(id) <= maxRequestID && printable(id) {
		return id
	}
	var b [12]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// corsExposed are the response headers a browser script may read.
const corsExposed = "X-Request-Id, X-Tandem-Worker, Retry-After"

// cors applies Config.AllowedOrigins to r: an allowed origin's response gets its
// Access-Control headers, and its preflight is answered here (true: nothing more to do).
// A preflight from an origin not allowed is refused with a 403 that says why.
func (s *Server) cors(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	allowed := s.cfg.AllowedOrigins
	if origin == "" || len(allowed) == 0 {
		return false
	}
	h := w.Header()
	h.Add("Vary", "Origin")
	preflight := r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != ""
	any := slices.Contains(allowed, "*")
	if !any && !slices.Contains(allowed, origin) {
		if !preflight {
			return false // served, without the headers that would let a browser read it
		}
		if s.cfg.OnRefused != nil {
			s.cfg.OnRefused("cors_origin")
		}
		h.Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusForbidden)
		w.Write([]byte("origin " + origin + " is not allowed (--allowed-origins)\n"))
		return true
	}
	if any {
		h.Set("Access-Control-Allow-Origin", "*")
	} else {
		h.Set("Access-Control-Allow-Origin", origin)
	}
	h.Set("Access-Control-Expose-Headers", corsExposed)
	if !preflight {
		return false
	}
	h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
	if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
		h.Set("Access-Control-Allow-Headers", strings.TrimSpace(req))
	}
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
}
