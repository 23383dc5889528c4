package loadgen

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// progress draws a one-line progress bar, redrawn in place.
type progress struct {
	w            io.Writer
	total        int
	done, failed atomic.Int64
	start        time.Time
	quit         chan struct{}
	wg           sync.WaitGroup
}

func startProgress(w io.Writer, total int) *progress {
	p := &progress{w: w, total: total, start: time.Now(), quit: make(chan struct{})}
	p.wg.Go(func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				p.draw()
			case <-p.quit:
				return
			}
		}
	})
	return p
}

func (p *progress) add(ok bool) {
	p.done.Add(1)
	if !ok {
		p.failed.Add(1)
	}
}

func (p *progress) draw() {
	done, failed := int(p.done.Load()), p.failed.Load()
	const width = 30
	fill := width * min(done, p.total) / max(p.total, 1)
	line := fmt.Sprintf("\r[%s%s] %d/%d requests", strings.Repeat("#", fill), strings.Repeat(".", width-fill), done, p.total)
	if failed > 0 {
		line += fmt.Sprintf(", %d failed", failed)
	}
	line += fmt.Sprintf(", %.1fs ", time.Since(p.start).Seconds())
	io.WriteString(p.w, line)
}

func (p *progress) stop() {
	close(p.quit)
	p.wg.Wait()
	p.draw()
	io.WriteString(p.w, "\n")
}
