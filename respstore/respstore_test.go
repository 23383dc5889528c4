package respstore

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"tandem/metrics"
)

// clock is a time the test moves.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func stores(t *testing.T, opts Options) map[string]func() *Store {
	dir := t.TempDir()
	return map[string]func() *Store{
		"memory": func() *Store { return NewMemory(opts) },
		"bbolt": func() *Store {
			s, err := Open(filepath.Join(dir, FileName), opts)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
	}
}

func TestStoreTTL(t *testing.T) {
	ctx := context.Background()
	for name, open := range stores(t, Options{}) {
		t.Run(name, func(t *testing.T) {
			clk := &clock{t: time.Unix(1_800_000_000, 0)}
			reg := prometheus.NewRegistry()
			met := metrics.NewResponses(reg, "tandem")
			s := open()
			s.opts.TTL, s.opts.Now, s.opts.Metrics = time.Hour, clk.now, met
			for i := range 3 {
				if err := s.Put(ctx, fmt.Sprint("r", i), []byte(fmt.Sprint("data", i))); err != nil {
					t.Fatal(err)
				}
				clk.t = clk.t.Add(20 * time.Minute)
			}
			// Now: r0 stored 60 min ago (expired), r1 40, r2 20.
			if _, ok, _ := s.Get(ctx, "r0"); ok {
				t.Error("r0 found after its TTL")
			}
			if d, ok, err := s.Get(ctx, "r1"); !ok || err != nil || string(d) != "data1" {
				t.Errorf("r1: %q %v %v", d, ok, err)
			}
			if n, err := s.Sweep(); n != 1 || err != nil {
				t.Errorf("sweep removed %d (%v), want 1", n, err)
			}
			if got := testutil.ToFloat64(met.Expired); got != 1 {
				t.Errorf("expired counter %v", got)
			}
			if got := testutil.ToFloat64(met.Stored); got != 2 {
				t.Errorf("stored gauge %v", got)
			}
			if ok, err := s.Delete(ctx, "r2"); !ok || err != nil {
				t.Errorf("delete r2: %v %v", ok, err)
			}
			if ok, _ := s.Delete(ctx, "r2"); ok {
				t.Error("r2 deleted twice")
			}
			if _, ok, _ := s.Get(ctx, "r2"); ok {
				t.Error("r2 found after its deletion")
			}
			clk.t = clk.t.Add(time.Hour)
			if n, _ := s.Sweep(); n != 1 {
				t.Errorf("second sweep removed %d, want 1 (r1)", n)
			}
			if got := testutil.ToFloat64(met.Stored); got != 0 {
				t.Errorf("stored gauge %v at the end", got)
			}
		})
	}
}

// The database survives a close and reopen (a process restart's part of it).
func TestStoreReopens(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), FileName)
	s, err := Open(path, Options{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "resp_1", []byte(`{"x":1}`)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	reg := prometheus.NewRegistry()
	met := metrics.NewResponses(reg, "tandem")
	s, err = Open(path, Options{TTL: time.Hour, Metrics: met})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if d, ok, err := s.Get(ctx, "resp_1"); !ok || err != nil || string(d) != `{"x":1}` {
		t.Errorf("after reopening: %q %v %v", d, ok, err)
	}
	if got := testutil.ToFloat64(met.Stored); got != 1 {
		t.Errorf("stored gauge after reopening %v", got)
	}
	if !s.Persistent() || NewMemory(Options{}).Persistent() {
		t.Error("Persistent")
	}
}

func TestSweepEvery(t *testing.T) {
	for _, tc := range []struct{ ttl, want time.Duration }{{time.Second, time.Second}, {time.Hour, 6 * time.Minute}, {720 * time.Hour, 10 * time.Minute}} {
		if got := SweepEvery(tc.ttl); got != tc.want {
			t.Errorf("SweepEvery(%v) = %v, want %v", tc.ttl, got, tc.want)
		}
	}
}
