package worker_test

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// udpRelay forwards UDP datagrams between its own socket on 127.0.0.1 and a target, with a
// socket of its own towards the target for each peer that writes to it (so the target sees
// as many peers as there are). Cut drops every datagram both ways from then on: to both
// sides the target has vanished as a host does when it loses power or is killed, without
// a word (no QUIC CONNECTION_CLOSE gets through, whatever either side sends). Heal forwards
// again.
type udpRelay struct {
	t      testing.TB
	front  *net.UDPConn
	target atomic.Pointer[net.UDPAddr] // nil: drop until set
	cut    atomic.Bool

	mu     sync.Mutex
	closed bool
	up     map[string]*net.UDPConn // the socket towards the target, by peer address
	wg     sync.WaitGroup
}

// newRelay starts a relay to target (nil: set it later with setTarget); it stops at cleanup.
func newRelay(t testing.TB, target *net.UDPAddr) *udpRelay {
	t.Helper()
	front, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	r := &udpRelay{t: t, front: front, up: map[string]*net.UDPConn{}}
	if target != nil {
		r.target.Store(target)
	}
	r.wg.Add(1)
	go r.serve()
	t.Cleanup(r.close)
	return r
}

// Addr is the address peers send to instead of the target's.
func (r *udpRelay) Addr() string { return r.front.LocalAddr().String() }

func (r *udpRelay) setTarget(addr string) { r.target.Store(udpAddr(r.t, addr)) }

func (r *udpRelay) Cut()  { r.cut.Store(true) }
func (r *udpRelay) Heal() { r.cut.Store(false) }

func (r *udpRelay) serve() {
	defer r.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, from, err := r.front.ReadFromUDP(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		target := r.target.Load()
		if r.cut.Load() || target == nil {
			continue
		}
		up := r.upstream(from, target)
		if up == nil {
			return
		}
		up.Write(buf[:n])
	}
}

// upstream returns the socket towards target for peer from, starting its return path.
func (r *udpRelay) upstream(from, target *net.UDPAddr) *net.UDPConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	if c := r.up[from.String()]; c != nil {
		return c
	}
	c, err := net.DialUDP("udp", nil, target)
	if err != nil {
		r.t.Error(err)
		return nil
	}
	r.up[from.String()] = c
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			if err != nil {
				continue // ICMP unreachable from a target that went away: keep listening
			}
			if !r.cut.Load() {
				r.front.WriteToUDP(buf[:n], from)
			}
		}
	}()
	return c
}

func (r *udpRelay) close() {
	r.mu.Lock()
	r.closed = true
	r.front.Close()
	for _, c := range r.up {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

func udpAddr(t testing.TB, addr string) *net.UDPAddr {
	t.Helper()
	a, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
