package live

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"tandem/router"
)

// TestSharePlaces: the router follows the place most registrations give it, counts and
// logs the registrations that disagree, gives the share to every model's State, and drops
// it when the workers naming it leave.
func TestSharePlaces(t *testing.T) {
	l := newTestRouter(t, Config{})
	st, err := router.NewState(router.DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	l.models["m"] = &liveModel{name: "m", state: st}
	want := func(step string, index, n int, disagreements float64) {
		t.Helper()
		if i, k := l.share.index, l.share.n; i != index || k != n { // l.mu is held: not Share
			t.Errorf("%s: router share %d of %d, want %d of %d", step, i, k, index, n)
		}
		if i, k := st.Share(); i != index || k != n {
			t.Errorf("%s: model's share %d of %d, want %d of %d", step, i, k, index, n)
		}
		if got := testutil.ToFloat64(l.met.ShareDisagreements); got != disagreements {
			t.Errorf("%s: %v disagreements counted, want %v", step, got, disagreements)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.countPlaceLocked(sharePlace{0, 0}, "old", +1)
	want("a worker naming no place", 0, 0, 0)
	l.countPlaceLocked(sharePlace{1, 2}, "a", +1)
	l.countPlaceLocked(sharePlace{1, 2}, "b", +1)
	want("two workers placing it 1 of 2", 1, 2, 0)
	l.countPlaceLocked(sharePlace{0, 3}, "c", +1)
	want("a third worker with another --join list", 1, 2, 1)
	l.countPlaceLocked(sharePlace{1, 2}, "a", -1)
	l.countPlaceLocked(sharePlace{1, 2}, "b", -1)
	want("only the dissenter left", 0, 3, 1)
	l.countPlaceLocked(sharePlace{0, 3}, "c", -1)
	want("all gone", 0, 0, 1)
}
