package router

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"tandem/internal/costs"
	"tandem/kvcache"
)

// The replay benchmark in the form of NVIDIA Dynamo's router benchmark: the Mooncake
// conversation trace's prompts (their 512-token hash ids expanded into chained 16-token
// block hashes) routed over N mock workers whose caches fill and evict as the routed
// prompts arrive, the router's index fed with the KV events those caches emit. A first,
// untimed pass routes the trace and records the decisions' requests and every worker's
// events in order; the timed pass replays them into a fresh router as fast as it goes:
// one goroutine per core applies the events (each worker's in order, workers split
// among the goroutines) while another takes the decisions. It reports operations
// (events applied plus decisions) per second, block operations (blocks stored, removed
// and looked up) per second, decision latency percentiles and the index's memory per
// (worker, block) entry at the end.
//
// The mock workers keep time roughly, so that load spreads the requests as it does on a
// cluster: on the trace's clock a worker computes its prompts one after the other at
// 0.06 ms per uncached token (the simulator's GPU timing) and decodes them side by side
// at 7 ms per output token; the router sees a request in flight until then (its
// predictions only: no load reports). The simulator (package sim) is the full model.
// Offered load in the timed pass is unlimited: the figure is the most the router
// achieves, not a rate it kept up with.

const (
	replayBlock    = 16
	replayHashIDs  = 512 / replayBlock // blocks per trace hash id
	replayCapacity = 28672             // blocks per mock worker: the simulator's default
	replayChunk    = 512               // blocks per Stored event: an 8192-token prefill chunk
)

type replayRow struct {
	Timestamp    int64    `json:"timestamp"` // ms
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

var replayTrace = sync.OnceValues(func() ([]replayRow, error) {
	dir := os.Getenv("TANDEM_WORKLOADS")
	if dir == "" {
		dir = filepath.Join("..", "..", "shared", "workloads")
	}
	f, err := os.Open(filepath.Join(dir, "mooncake", "conversation_trace.jsonl"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows []replayRow
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var r replayRow
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, sc.Err()
})

// replayHashes expands a row into its full blocks' chained sequence hashes.
func replayHashes(r replayRow, dst []uint64) []uint64 {
	dst = dst[:0]
	n := r.InputLength / replayBlock
	var parent uint64
	for i := range n {
		id := r.HashIDs[min(i/replayHashIDs, len(r.HashIDs)-1)]
		x := parent ^ (id<<5 | uint64(i%replayHashIDs)) ^ 0x51afd7ed558ccd
		x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
		x = (x ^ (x >> 27)) * 0x94d049bb133111eb
		parent = x ^ (x >> 31)
		dst = append(dst, parent)
	}
	return dst
}

// mockCache is a worker's prefix cache of blocks with LRU eviction.
type mockCache struct {
	capacity   int
	slot       map[uint64]int32
	hash       []uint64
	prev, next []int32
	head, tail int32 // most and least recently used
	free       []int32
	id         uint64 // last event id
}

func newMockCache(capacity int) *mockCache {
	return &mockCache{capacity: capacity, slot: map[uint64]int32{}, head: -1, tail: -1}
}

func (c *mockCache) unlink(i int32) {
	if p := c.prev[i]; p >= 0 {
		c.next[p] = c.next[i]
	} else {
		c.head = c.next[i]
	}
	if n := c.next[i]; n >= 0 {
		c.prev[n] = c.prev[i]
	} else {
		c.tail = c.prev[i]
	}
}

func (c *mockCache) pushFront(i int32) {
	c.prev[i], c.next[i] = -1, c.head
	if c.head >= 0 {
		c.prev[c.head] = i
	}
	c.head = i
	if c.tail < 0 {
		c.tail = i
	}
}

// admit runs a prompt: its cached leading blocks are used, the rest computed and stored,
// the least recently used blocks evicted to make room; it returns the events.
func (c *mockCache) admit(hs []uint64, evs []kvcache.Event) []kvcache.Event {
	hit := 0
	for hit < len(hs) {
		i, ok := c.slot[hs[hit]]
		if !ok {
			break
		}
		c.unlink(i)
		c.pushFront(i)
		hit++
	}
	var removed []uint64
	for k := hit; k < len(hs); k += replayChunk {
		chunk := hs[k:min(k+replayChunk, len(hs))]
		var stored []uint64
		for _, h := range chunk {
			if _, ok := c.slot[h]; ok {
				continue
			}
			if len(c.slot) >= c.capacity {
				v := c.tail
				c.unlink(v)
				delete(c.slot, c.hash[v])
				removed = append(removed, c.hash[v])
				c.free = append(c.free, v)
			}
			var i int32
			if n := len(c.free); n > 0 {
				i = c.free[n-1]
				c.free = c.free[:n-1]
				c.hash[i] = h
			} else {
				i = int32(len(c.hash))
				c.hash, c.prev, c.next = append(c.hash, h), append(c.prev, 0), append(c.next, 0)
			}
			c.slot[h] = i
			c.pushFront(i)
			stored = append(stored, h)
		}
		if len(removed) > 0 {
			c.id++
			evs = append(evs, kvcache.Event{ID: c.id, Kind: kvcache.EventRemoved, Hashes: removed})
			removed = nil
		}
		if len(stored) > 0 {
			parent := uint64(0)
			if k > 0 {
				parent = hs[k-1]
			}
			c.id++
			evs = append(evs, kvcache.Event{ID: c.id, Kind: kvcache.EventStored, Parent: parent, Hashes: stored})
		}
	}
	return evs
}

// replayStep is one request of the replay: the decision's request, then the events its
// admission caused on worker w.
type replayStep struct {
	req    Request
	w      WorkerID
	events []kvcache.Event
}

func replayCard() Card {
	return Card{Model: "m", HashVersion: kvcache.HashVersion, BlockSize: replayBlock, Salt: 1, KVBlocks: replayCapacity}
}

func replayState(tb testing.TB, workers int) *State {
	cfg := DefaultConfig()
	cfg.BusyWaiting = 0
	s, err := NewState(cfg, nil)
	if err != nil {
		tb.Fatal(err)
	}
	for w := range WorkerID(workers) {
		if err := s.AddWorker(w, replayCard()); err != nil {
			tb.Fatal(err)
		}
	}
	return s
}

// recordReplay routes the trace over workers mock workers and records the steps.
func recordReplay(tb testing.TB, rows []replayRow, workers int) []replayStep {
	s := replayState(tb, workers)
	caches := make([]*mockCache, workers)
	for i := range caches {
		caches[i] = newMockCache(replayCapacity)
	}
	type running struct {
		first, done float64 // ms
		in          Inflight
	}
	var inflight []*running
	freeAt := make([]float64, workers) // when a worker's last prompt is computed, ms
	steps := make([]replayStep, 0, len(rows))
	for _, r := range rows {
		now := float64(r.Timestamp)
		inflight = slices.DeleteFunc(inflight, func(q *running) bool {
			if q.first <= now {
				s.PrefillDone(&q.in)
			}
			if q.done <= now {
				s.RemoveInflight(q.in)
				return true
			}
			return false
		})
		hs := replayHashes(r, nil)
		req := Request{Hashes: hs, PromptTokens: r.InputLength}
		d, err := s.Decide(req)
		if err != nil {
			tb.Fatal(err)
		}
		start := max(now, freeAt[d.Worker])
		first := start + 0.06*float64(r.InputLength-d.HostOverlap*replayBlock)
		freeAt[d.Worker] = first
		inflight = append(inflight, &running{first: first, done: first + 7*float64(r.OutputLength), in: d.Inflight})
		evs := caches[d.Worker].admit(hs, nil)
		for _, ev := range evs {
			if gap, err := s.ApplyEvent(d.Worker, ev); gap || err != nil {
				tb.Fatalf("record: gap %v, err %v", gap, err)
			}
		}
		steps = append(steps, replayStep{req: req, w: d.Worker, events: evs})
	}
	return steps
}

// BenchmarkReplay's sub-benchmarks: workers=N/decide routes every request (the router's
// decision: the overlap walk, the costs and the draw, the in-flight bookkeeping);
// workers=N/lookup only looks its prompt up in the index (Index.OverlapWith), which is what
// Dynamo's benchmark times as a request (find_matches). Besides our units it reports
// Dynamo's: dyn-block-ops/s counts the requests' blocks and the Stored events' blocks, not
// the Removed ones' (ops/s is the same unit in both: requests plus events). With -short
// it replays the trace's first 2,000 prompts. workers=N/events applies the events alone
// (no requests), one goroutine per core, and reports their blocks per second. Both also
// report the process's CPU time over the timed pass (cpu-ms; cpu-ns/block for the events
// alone), which other processes on a shared machine do not stretch as they do the wall
// clock.
func BenchmarkReplay(b *testing.B) {
	rows, err := replayTrace()
	if err != nil {
		b.Skipf("no Mooncake trace (%v); set TANDEM_WORKLOADS to shared/workloads", err)
	}
	if testing.Short() {
		rows = rows[:min(len(rows), 2000)]
	}
	for _, workers := range []int{16, 256, 1000} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			steps := recordReplay(b, rows, workers)
			for _, lookup := range []bool{false, true} {
				name := "decide"
				if lookup {
					name = "lookup"
				}
				b.Run(name, func(b *testing.B) { replayTimed(b, steps, workers, lookup) })
			}
			b.Run("events", func(b *testing.B) { replayEvents(b, steps, workers) })
		})
	}
}

// replayTimed replays steps into a fresh router (see BenchmarkReplay) and reports.
func replayTimed(b *testing.B, steps []replayStep, workers int, lookup bool) {
	var events, blocks, stored, looked int
	for _, st := range steps {
		events += len(st.events)
		looked += len(st.req.Hashes)
		for _, ev := range st.events {
			blocks += len(ev.Hashes)
			if ev.Kind == kvcache.EventStored {
				stored += len(ev.Hashes)
			}
		}
	}
	var lat, cpu []time.Duration
	var elapsed, pcpu time.Duration
	var last *State
	var wk Walk
	var matches []Match
	for b.Loop() {
		s := replayState(b, workers)
		lat, cpu = lat[:0], cpu[:0]
		t0, p0 := time.Now(), costs.ProcessCPU()
		wg := applyReplay(s.Index(), steps)
		runtime.LockOSThread()
		for _, st := range steps {
			t, c := time.Now(), threadCPU()
			if lookup {
				matches = s.Index().OverlapWith(&wk, st.req.Hashes, matches)
				cpu = append(cpu, threadCPU()-c)
				lat = append(lat, time.Since(t))
				continue
			}
			d, err := s.Decide(st.req)
			cpu = append(cpu, threadCPU()-c)
			lat = append(lat, time.Since(t))
			if err != nil {
				b.Fatal(err)
			}
			s.RemoveInflight(d.Inflight)
		}
		runtime.UnlockOSThread()
		wg.Wait()
		elapsed += time.Since(t0)
		pcpu += costs.ProcessCPU() - p0
		last = s
	}
	sec := elapsed.Seconds() / float64(b.N)
	x := last.Index()
	b.ReportMetric(float64(events+len(steps))/sec, "ops/s")
	b.ReportMetric(float64(blocks+looked)/sec, "block-ops/s")
	b.ReportMetric(float64(stored+looked)/sec, "dyn-block-ops/s")
	b.ReportMetric(pcpu.Seconds()*1000/float64(b.N), "cpu-ms")
	reportLatencies(b, "", lat)
	reportLatencies(b, "cpu-", cpu)
	b.ReportMetric(float64(x.Entries()), "entries")
	b.ReportMetric(float64(x.Bytes())/float64(max(1, x.Entries())), "B/entry")
}

// replayEvents applies the replay's events alone into a fresh router, one goroutine per
// core (each worker's events in order), and reports their blocks per second.
func replayEvents(b *testing.B, steps []replayStep, workers int) {
	blocks := 0
	for _, st := range steps {
		for _, ev := range st.events {
			blocks += len(ev.Hashes)
		}
	}
	var elapsed, pcpu time.Duration
	for b.Loop() {
		x := replayState(b, workers).Index()
		t0, p0 := time.Now(), costs.ProcessCPU()
		applyReplay(x, steps).Wait()
		elapsed += time.Since(t0)
		pcpu += costs.ProcessCPU() - p0
	}
	b.ReportMetric(float64(blocks)*float64(b.N)/elapsed.Seconds(), "blocks/s")
	b.ReportMetric(float64(elapsed.Nanoseconds())/float64(blocks*b.N), "ns/block")
	b.ReportMetric(float64(pcpu.Nanoseconds())/float64(blocks*b.N), "cpu-ns/block")
}

// applyReplay starts one goroutine per core applying the steps' events to x, each worker's
// in order (the workers split among the goroutines); wait on the result.
func applyReplay(x *Index, steps []replayStep) *sync.WaitGroup {
	appliers := max(1, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for g := range appliers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, st := range steps {
				if int(st.w)%appliers != g {
					continue
				}
				for _, ev := range st.events {
					if x.Apply(st.w, ev) {
						panic("replay: gap")
					}
				}
			}
		}()
	}
	return &wg
}
