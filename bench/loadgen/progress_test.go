package loadgen

import (
	"strings"
	"sync"
	"testing"
)

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func TestProgress(t *testing.T) {
	var buf syncBuf
	p := startProgress(&buf, 4)
	p.add(true)
	p.add(false)
	p.add(true)
	p.stop()
	out := buf.b.String()
	if !strings.Contains(out, "\r[######################........] 3/4 requests, 1 failed") || !strings.HasSuffix(out, "\n") {
		t.Errorf("progress output %q", out)
	}
}
