package orpc

import (
	"net"
	"time"
)

// JoinLimits bounds join attempts per client address (its IP), with two token buckets: one
// charged by every attempt, loose enough for a fleet joining at once from one host (a
// hundred sim replicas), and a tight one charged by rejected attempts (a wrong token, a bad
// request), which, once empty, refuses every attempt from that address until it refills.
// Refused attempts end with ResourceExhausted before the token is looked at. Zero fields
// take the defaults.
type JoinLimits struct {
	Rate        float64       // attempts per second per address (default 50)
	Burst       int           // attempts at once per address (default 200)
	RejectRate  float64       // rejected attempts per second per address (default 0.2: one per 5 s)
	RejectBurst int           // rejected attempts at once per address (default 10)
	LogInterval time.Duration // a refused address is logged at most this often, with a count (default 10 s)
	// MaxAddrs bounds the addresses remembered (default 4096): past it, those whose buckets
	// have refilled are forgotten first.
	MaxAddrs int
}

// DefaultJoinLimits are the limits of a JoinConfig that sets none.
var DefaultJoinLimits = JoinLimits{Rate: 50, Burst: 200, RejectRate: 0.2, RejectBurst: 10, LogInterval: 10 * time.Second, MaxAddrs: 4096}

func (l JoinLimits) withDefaults() JoinLimits {
	d := DefaultJoinLimits
	if l.Rate <= 0 {
		l.Rate = d.Rate
	}
	if l.Burst <= 0 {
		l.Burst = d.Burst
	}
	if l.RejectRate <= 0 {
		l.RejectRate = d.RejectRate
	}
	if l.RejectBurst <= 0 {
		l.RejectBurst = d.RejectBurst
	}
	if l.LogInterval <= 0 {
		l.LogInterval = d.LogInterval
	}
	if l.MaxAddrs <= 0 {
		l.MaxAddrs = d.MaxAddrs
	}
	return l
}

// bucket is a token bucket: tokens refill at rate per second up to burst.
type bucket struct {
	tokens float64
	at     time.Time
}

func (b *bucket) refill(now time.Time, rate float64, burst int) {
	if b.at.IsZero() {
		b.tokens = float64(burst)
	} else if dt := now.Sub(b.at).Seconds(); dt > 0 {
		b.tokens = min(float64(burst), b.tokens+dt*rate)
	}
	b.at = now
}

// joinAddr is one address's state.
type joinAddr struct {
	all, rejected bucket
	refused       int       // refusals not yet logged
	logged        time.Time // when refusals were last logged
}

// joinLimiter applies JoinLimits. It is a pure core: the caller passes the time and holds
// the lock.
type joinLimiter struct {
	lim   JoinLimits
	addrs map[string]*joinAddr
}

func newJoinLimiter(lim JoinLimits) *joinLimiter {
	return &joinLimiter{lim: lim.withDefaults(), addrs: map[string]*joinAddr{}}
}

// addrKey is the key of a peer address: its IP (a client redials from new ports).
func addrKey(a net.Addr) string {
	if ua, ok := a.(*net.UDPAddr); ok {
		return ua.IP.String()
	}
	if a == nil {
		return ""
	}
	if h, _, err := net.SplitHostPort(a.String()); err == nil {
		return h
	}
	return a.String()
}

// allow takes an attempt from addr at now. When it is refused, log reports whether to log
// it now and refused how many refusals (this one included) the log line covers.
func (jl *joinLimiter) allow(addr string, now time.Time) (ok, log bool, refused int) {
	a := jl.entry(addr, now)
	a.all.refill(now, jl.lim.Rate, jl.lim.Burst)
	a.rejected.refill(now, jl.lim.RejectRate, jl.lim.RejectBurst)
	if a.rejected.tokens >= 1 && a.all.tokens >= 1 {
		a.all.tokens--
		return true, false, 0
	}
	a.refused++
	if !a.logged.IsZero() && now.Sub(a.logged) < jl.lim.LogInterval {
		return false, false, 0
	}
	refused, a.refused, a.logged = a.refused, 0, now
	return false, true, refused
}

// reject charges a rejected attempt from addr to its reject bucket.
func (jl *joinLimiter) reject(addr string, now time.Time) {
	a := jl.entry(addr, now)
	a.rejected.refill(now, jl.lim.RejectRate, jl.lim.RejectBurst)
	a.rejected.tokens = max(a.rejected.tokens-1, 0)
}

func (jl *joinLimiter) entry(addr string, now time.Time) *joinAddr {
	if a := jl.addrs[addr]; a != nil {
		return a
	}
	if len(jl.addrs) >= jl.lim.MaxAddrs {
		jl.forget(now)
	}
	a := &joinAddr{}
	jl.addrs[addr] = a
	return a
}

// forget drops the addresses whose buckets have refilled (they are as if new), and, if
// that is not enough, arbitrary ones: the memory stays bounded whatever the number of
// addresses trying.
func (jl *joinLimiter) forget(now time.Time) {
	for k, a := range jl.addrs {
		a.all.refill(now, jl.lim.Rate, jl.lim.Burst)
		a.rejected.refill(now, jl.lim.RejectRate, jl.lim.RejectBurst)
		if a.all.tokens >= float64(jl.lim.Burst) && a.rejected.tokens >= float64(jl.lim.RejectBurst) && a.refused == 0 {
			delete(jl.addrs, k)
		}
	}
	for k := range jl.addrs {
		if len(jl.addrs) < jl.lim.MaxAddrs {
			break
		}
		delete(jl.addrs, k)
	}
}
