package orpc

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// The limiter's buckets, on a clock of the test's: a burst of attempts, then the rate; a
// few rejected attempts shut an address out until its reject bucket refills; other
// addresses are not affected; refusals are logged once per interval with their count.
func TestJoinLimiter(t *testing.T) {
	lim := JoinLimits{Rate: 10, Burst: 20, RejectRate: 0.5, RejectBurst: 3, LogInterval: 10 * time.Second}
	t0 := time.Unix(1000, 0)
	type step struct {
		at     time.Duration // since t0
		addr   string
		reject bool // charge a rejection instead of asking
		n      int  // attempts (or rejections)
		ok     int  // of them allowed
		logs   []int
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{name: "burst then rate", steps: []step{
			{addr: "a", n: 25, ok: 20, logs: []int{1}},       // the 21st is logged, the next four only counted
			{at: time.Second, addr: "a", n: 15, ok: 10},      // 10 refilled; refusals within the interval are counted
			{at: 11 * time.Second, addr: "a", n: 1, ok: 1},   // refilled to the burst
			{at: 11 * time.Second, addr: "b", n: 20, ok: 20}, // another address has its own buckets
		}},
		{name: "refusals logged once per interval with their count", steps: []step{
			{addr: "a", n: 30, ok: 20, logs: []int{1}},
			{at: 9 * time.Second, addr: "a", reject: true, n: 3},
			{at: 9 * time.Second, addr: "a", n: 5},
			{at: 10 * time.Second, addr: "a", n: 1, logs: []int{15}}, // 9 + 5 + this one
		}},
		{name: "rejections shut the address out", steps: []step{
			{addr: "a", n: 3, ok: 3},
			{addr: "a", reject: true, n: 3},
			{addr: "a", n: 2, ok: 0, logs: []int{1}},             // rejected bucket empty: refused however full the other
			{addr: "b", n: 1, ok: 1},                             // not b
			{at: 2 * time.Second, addr: "a", n: 2, ok: 2},        // one rejection refilled: it may try until it fails
			{at: 2 * time.Second, addr: "a", reject: true, n: 1}, // and spent again
			{at: 2 * time.Second, addr: "a", n: 1, ok: 0},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			jl := newJoinLimiter(lim)
			for i, s := range tc.steps {
				now := t0.Add(s.at)
				ok := 0
				var logs []int
				for range s.n {
					if s.reject {
						jl.reject(s.addr, now)
						continue
					}
					allowed, log, n := jl.allow(s.addr, now)
					if allowed {
						ok++
					}
					if log {
						logs = append(logs, n)
					}
				}
				if ok != s.ok || fmt.Sprint(logs) != fmt.Sprint(s.logs) {
					t.Errorf("step %d: %d allowed, logs %v; want %d, %v", i, ok, logs, s.ok, s.logs)
				}
			}
		})
	}
}

// However many addresses try, the limiter remembers a bounded number.
func TestJoinLimiterBounded(t *testing.T) {
	jl := newJoinLimiter(JoinLimits{MaxAddrs: 100})
	now := time.Unix(1000, 0)
	for i := range 10000 {
		addr := fmt.Sprintf("10.0.%d.%d", i/256, i%256)
		jl.allow(addr, now)
		jl.reject(addr, now)
		if len(jl.addrs) > 100 {
			t.Fatalf("%d addresses remembered after %d, want at most 100", len(jl.addrs), i+1)
		}
	}
}

// Over QUIC: a client that keeps trying wrong tokens is shut out with ResourceExhausted
// after a few (even with the right token, until its bucket refills), logged once with a
// count rather than once per attempt, and counted; a hundred nodes joining at once from
// one host, with the default limits, all get in.
func TestJoinRateLimited(t *testing.T) {
	ca, _ := NewCA("test cluster")
	id, _ := ca.NewIdentity("router", []string{"127.0.0.1"})
	tok, _ := GenerateToken()
	start := func(lim JoinLimits) (addr string, logs *syncBuffer, counts func() map[string]int) {
		logs = &syncBuffer{}
		var mu sync.Mutex
		refused := map[string]int{}
		s := NewServer(WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
		s.EnableJoin(JoinConfig{CA: ca, Tokens: func() []Token { return []Token{tok} }, Limits: lim,
			OnRefused: func(reason string) { mu.Lock(); refused[reason]++; mu.Unlock() }})
		addr, _ = serve(t, s, id)
		return addr, logs, func() map[string]int {
			mu.Lock()
			defer mu.Unlock()
			return map[string]int{JoinRefusedToken: refused[JoinRefusedToken], JoinRefusedRateLimited: refused[JoinRefusedRateLimited]}
		}
	}
	ctx := testCtx(t)

	t.Run("wrong tokens", func(t *testing.T) {
		addr, logs, counts := start(JoinLimits{RejectBurst: 3, RejectRate: 0.001})
		wrong := Token{ID: tok.ID, Secret: "0123456789abcdef"}
		for i := range 3 {
			if _, err := Join(ctx, addr, wrong, "intruder", nil, WithLogger(quietLogger())); !errors.Is(err, ErrJoinTokenRejected) {
				t.Fatalf("attempt %d: %v, want the token rejected", i, err)
			}
		}
		for i, tk := range []Token{wrong, wrong, wrong, tok} {
			_, err := Join(ctx, addr, tk, "intruder", nil, WithLogger(quietLogger()))
			if !errors.Is(err, ErrResourceExhausted) || !strings.Contains(err.Error(), "too many attempts") {
				t.Fatalf("attempt %d after 3 rejections: %v, want ResourceExhausted", i+3, err)
			}
		}
		got := logs.String()
		if n := strings.Count(got, "join token rejected"); n != 3 {
			t.Errorf("%d rejections logged, want 3:\n%s", n, got)
		}
		if n := strings.Count(got, "join attempts refused"); n != 1 {
			t.Errorf("%d refusal logs, want 1 for 4 refusals within the interval:\n%s", n, got)
		}
		if c := counts(); c[JoinRefusedToken] != 3 || c[JoinRefusedRateLimited] != 4 {
			t.Errorf("refusals counted %v, want 3 token and 4 rate_limited", c)
		}
	})

	t.Run("a hundred at once", func(t *testing.T) {
		addr, logs, counts := start(JoinLimits{})
		const n = 100
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// QUIC itself refuses connections past its accept queue when the
				// machine is busy; a worker retries those (with backoff), and so does
				// this test. A refusal by the join limits (ResourceExhausted) is final.
				var err error
				for try := range 5 {
					_, err = Join(ctx, addr, tok, fmt.Sprintf("replica-%d", i), nil, WithLogger(quietLogger()))
					var st *Status
					if err == nil || !errors.As(err, &st) || st.Code != Unavailable {
						break
					}
					time.Sleep(time.Duration(50*(try+1)) * time.Millisecond)
				}
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("a join of %d at once failed: %v\n%s", n, err, logs.String())
			}
		}
		if c := counts(); c[JoinRefusedRateLimited] != 0 {
			t.Errorf("refusals %v", c)
		}
	})
}
