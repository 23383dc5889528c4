package openai

import (
	"runtime/debug"
	"sync"
	"time"
)

// Bodies this large leave tens to hundreds of MB of garbage (the body, its JSON, the
// prompt's text); after one, the heap is collected and its free pages handed back to
// the OS, at most once per memoryReturnEvery, instead of holding the peak for minutes.
const (
	memoryReturnBody  = 4 << 20
	memoryReturnEvery = 10 * time.Second
)

// memoryReturn returns memory to the OS after large requests (see memoryReturnBody).
type memoryReturn struct {
	mu      sync.Mutex
	last    time.Time
	pending bool
}

// after is called at the end of each request with its body's declared length (-1 when
// unknown: chunked bodies are treated as large).
func (m *memoryReturn) after(bodyLen int64) {
	if bodyLen >= 0 && bodyLen < memoryReturnBody {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.pending || time.Since(m.last) < memoryReturnEvery {
		return
	}
	m.pending = true
	go func() {
		debug.FreeOSMemory()
		m.mu.Lock()
		m.pending, m.last = false, time.Now()
		m.mu.Unlock()
	}()
}
