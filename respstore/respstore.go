// Package respstore keeps the Responses API's stored responses by id, for a TTL: in an
// embedded bbolt database (a file under the process's state directory, so they survive a
// restart), or in memory. Expired responses are not found, and a periodic sweep removes them.
package respstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"tandem/metrics"
)

// FileName is the database's file name in the state directory.
const FileName = "responses.db"

// Bucket names carry the layout's version: byID holds id → stored time (8 bytes, Unix
// nanoseconds, big-endian) + the response; byTime holds stored time + id → nothing, in
// time order, for the sweep.
var (
	byID   = []byte("responses/1")
	byTime = []byte("responses-by-time/1")
)

// Options configures a Store.
type Options struct {
	// TTL is how long a response is kept after it is stored; 0 keeps it until deleted.
	TTL     time.Duration
	Metrics *metrics.Responses // nil counts nothing
	Logger  *slog.Logger       // default slog.Default()
	Now     func() time.Time   // default time.Now (tests move it)
}

// Store is a response store. Its methods are safe for concurrent use.
type Store struct {
	opts Options
	db   *bolt.DB // nil: in memory

	mu  sync.Mutex // the in-memory store's
	mem map[string]entry

	sweepErrLogged bool
}

type entry struct {
	at   time.Time
	data []byte
}

func (o *Options) fill() {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Open opens (creating it if need be) the database at path.
func Open(path string, opts Options) (*Store, error) {
	opts.fill()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("respstore: opening %s: %w", path, err)
	}
	s := &Store{opts: opts, db: db}
	n := 0
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(byID)
		if err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists(byTime); err != nil {
			return err
		}
		n = b.Stats().KeyN
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("respstore: %s: %w", path, err)
	}
	s.setStored(n)
	return s, nil
}

// NewMemory returns a store in memory: what it keeps is lost when the process ends.
func NewMemory(opts Options) *Store {
	opts.fill()
	return &Store{opts: opts, mem: map[string]entry{}}
}

// Persistent reports whether the store survives a restart.
func (s *Store) Persistent() bool { return s.db != nil }

// Close closes the database.
func (s *Store) Close() error {
	if s.db == nil {
		return nil
	}
	return s.db.Close()
}

func (s *Store) setStored(n int) {
	if s.opts.Metrics != nil {
		s.opts.Metrics.Stored.Set(float64(n))
	}
}

func (s *Store) addStored(d int) {
	if s.opts.Metrics != nil {
		s.opts.Metrics.Stored.Add(float64(d))
	}
}

func (s *Store) expired(at time.Time) bool {
	return s.opts.TTL > 0 && !s.opts.Now().Before(at.Add(s.opts.TTL))
}

func timeKey(at time.Time, id string) []byte {
	k := make([]byte, 8+len(id))
	binary.BigEndian.PutUint64(k, uint64(at.UnixNano()))
	copy(k[8:], id)
	return k
}

// Put stores data under id (replacing what was there).
func (s *Store) Put(ctx context.Context, id string, data []byte) error {
	if id == "" {
		return errors.New("respstore: empty id")
	}
	at := s.opts.Now()
	if s.db == nil {
		s.mu.Lock()
		_, had := s.mem[id]
		s.mem[id] = entry{at: at, data: append([]byte(nil), data...)}
		s.mu.Unlock()
		if !had {
			s.addStored(1)
		}
		return nil
	}
	added := false
	err := s.db.Update(func(tx *bolt.Tx) error {
		ids, times := tx.Bucket(byID), tx.Bucket(byTime)
		if old := ids.Get([]byte(id)); len(old) >= 8 {
			if err := times.Delete(append(old[:8:8], id...)); err != nil {
				return err
			}
		} else {
			added = true
		}
		v := make([]byte, 8+len(data))
		binary.BigEndian.PutUint64(v, uint64(at.UnixNano()))
		copy(v[8:], data)
		if err := ids.Put([]byte(id), v); err != nil {
			return err
		}
		return times.Put(timeKey(at, id), nil)
	})
	if err != nil {
		return fmt.Errorf("respstore: storing %s: %w", id, err)
	}
	if added {
		s.addStored(1)
	}
	return nil
}

// Get returns the data stored under id, if it is there and has not expired.
func (s *Store) Get(ctx context.Context, id string) ([]byte, bool, error) {
	if s.db == nil {
		s.mu.Lock()
		e, ok := s.mem[id]
		s.mu.Unlock()
		if !ok || s.expired(e.at) {
			return nil, false, nil
		}
		return e.data, true, nil
	}
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(byID).Get([]byte(id))
		if len(v) < 8 || s.expired(time.Unix(0, int64(binary.BigEndian.Uint64(v)))) {
			return nil
		}
		out = append([]byte(nil), v[8:]...)
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("respstore: reading %s: %w", id, err)
	}
	return out, out != nil, nil
}

// Delete removes id; it reports whether it was there (an expired one was not).
func (s *Store) Delete(ctx context.Context, id string) (bool, error) {
	if s.db == nil {
		s.mu.Lock()
		e, ok := s.mem[id]
		delete(s.mem, id)
		s.mu.Unlock()
		if ok {
			s.addStored(-1)
		}
		return ok && !s.expired(e.at), nil
	}
	found, live := false, false
	err := s.db.Update(func(tx *bolt.Tx) error {
		ids := tx.Bucket(byID)
		v := ids.Get([]byte(id))
		if len(v) < 8 {
			return nil
		}
		found = true
		live = !s.expired(time.Unix(0, int64(binary.BigEndian.Uint64(v))))
		if err := tx.Bucket(byTime).Delete(append(v[:8:8], id...)); err != nil {
			return err
		}
		return ids.Delete([]byte(id))
	})
	if err != nil {
		return false, fmt.Errorf("respstore: deleting %s: %w", id, err)
	}
	if found {
		s.addStored(-1)
	}
	return live, nil
}

// Sweep removes the responses whose TTL has passed and returns how many.
func (s *Store) Sweep() (int, error) {
	if s.opts.TTL <= 0 {
		return 0, nil
	}
	cutoff := s.opts.Now().Add(-s.opts.TTL)
	n := 0
	if s.db == nil {
		s.mu.Lock()
		for id, e := range s.mem {
			if !e.at.After(cutoff) {
				delete(s.mem, id)
				n++
			}
		}
		s.mu.Unlock()
	} else {
		err := s.db.Update(func(tx *bolt.Tx) error {
			ids, times := tx.Bucket(byID), tx.Bucket(byTime)
			c := times.Cursor()
			var done [][]byte
			for k, _ := c.First(); k != nil && len(k) >= 8; k, _ = c.Next() {
				if time.Unix(0, int64(binary.BigEndian.Uint64(k))).After(cutoff) {
					break
				}
				done = append(done, append([]byte(nil), k...))
			}
			for _, k := range done {
				if err := times.Delete(k); err != nil {
					return err
				}
				if err := ids.Delete(k[8:]); err != nil {
					return err
				}
			}
			n = len(done)
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("respstore: sweeping: %w", err)
		}
	}
	if n > 0 && s.opts.Metrics != nil {
		s.opts.Metrics.Expired.Add(float64(n))
		s.addStored(-n)
	}
	return n, nil
}

// SweepEvery is how often Run sweeps for a TTL: a tenth of it, between a second and ten
// minutes.
func SweepEvery(ttl time.Duration) time.Duration {
	return min(max(ttl/10, time.Second), 10*time.Minute)
}

// Run sweeps every SweepEvery(TTL) until ctx is done. A failed sweep is logged (the first
// time only, until one succeeds) and tried again at the next tick.
func (s *Store) Run(ctx context.Context) {
	if s.opts.TTL <= 0 {
		return
	}
	t := time.NewTicker(SweepEvery(s.opts.TTL))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, err := s.Sweep()
		switch {
		case err != nil && !s.sweepErrLogged:
			s.sweepErrLogged = true
			s.opts.Logger.Error("sweeping expired responses failed", "err", err)
		case err == nil:
			s.sweepErrLogged = false
			if n > 0 {
				s.opts.Logger.Debug("expired responses removed", "count", n)
			}
		}
	}
}
