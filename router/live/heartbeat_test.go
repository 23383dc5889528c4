package live

import (
	"testing"
	"time"

	"tandem/router"
)

// A late heartbeat check credits its lateness to every worker: their reports could not be
// taken while the router itself stalled. The credit never puts a report in the future.
func TestCreditStall(t *testing.T) {
	l := newTestRouter(t, Config{})
	now := time.Now()
	old, recent := &liveWorker{id: 1}, &liveWorker{id: 2}
	old.beat.Store(now.Add(-3 * time.Second).UnixNano())
	recent.beat.Store(now.Add(-100 * time.Millisecond).UnixNano())
	l.byID.Store(router.WorkerID(1), old)
	l.byID.Store(router.WorkerID(2), recent)
	l.creditStall(2 * time.Second)
	if got := now.Sub(old.lastBeat()); got < 900*time.Millisecond || got > 1100*time.Millisecond {
		t.Errorf("silent %v after a 2 s credit to a 3 s silence, want ≈ 1 s", got)
	}
	if got := recent.lastBeat(); got.After(time.Now()) {
		t.Errorf("credit put a report in the future: %v", got)
	}
}
