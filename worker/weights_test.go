package worker_test

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"tandem/cluster"
	"tandem/engine"
	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/internal/filehash"
	"tandem/internal/fixtures"
	"tandem/kvcache"
	"tandem/metrics"
	"tandem/model"
	"tandem/worker"
)

// exported is a model's prepared weights as a worker serves them: the forms its backend
// made at load, by weight name.
type exported struct {
	hash  []byte
	forms map[string]hal.Prepared
}

func (s *exported) ContentHash() []byte { return s.hash }

func (s *exported) PreparedWeight(name string) (string, []byte, bool) {
	p, ok := s.forms[name]
	return p.Format, p.Data, ok
}

// weightsPeer runs a worker over the model at path with its prepared weights to serve.
func weightsPeer(t *testing.T, env *peerEnv, path string, cfg worker.Config) (*peerNode, *exported, *metrics.WeightsTransfer) {
	t.Helper()
	be := cpu.New(1)
	m, err := model.Load(path, be)
	if err != nil {
		t.Fatal(err)
	}
	m.Prefault(be, nil)
	sum, err := filehash.Of(path, "")
	if err != nil {
		t.Fatal(err)
	}
	src := &exported{hash: sum.Sum[:], forms: map[string]hal.Prepared{}}
	for _, w := range m.Matrices() {
		if p, ok := be.ExportWeight(w); ok {
			src.forms[w.Name] = p
		}
	}
	if len(src.forms) == 0 {
		t.Skipf("no packed layouts under ISA %s on this CPU: nothing to pull", cpu.KernelISA())
	}
	eng, err := engine.New(m, be, engine.Config{KVBlocks: 128, BlockSize: 16, Salt: kvcache.Salt(modelName, "", "")})
	if err != nil {
		t.Fatal(err)
	}
	met := metrics.NewWeightsTransfer(prometheus.NewRegistry())
	cfg.Weights, cfg.WeightsMetrics = src, met
	return env.startEngine("a", path, m, eng, cfg, func() { m.Close(); be.Close() }), src, met
}

// puller is a second engine's model and backend, and what it asks a peer for.
type puller struct {
	be   *cpu.Backend
	m    *model.Model
	ws   []*hal.Weight
	want []cluster.WantedWeight
	mem  []byte
	free func()
	dst  [][]byte
}

func newPuller(t *testing.T, path string) *puller {
	be := cpu.New(1)
	m, err := model.Load(path, be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close(); be.Close() })
	p := &puller{be: be, m: m}
	total := 0
	for _, w := range m.Matrices() {
		if format, size, ok := be.PreparedFormat(w); ok {
			p.ws = append(p.ws, w)
			p.want = append(p.want, cluster.WantedWeight{Name: w.Name, Format: format, Size: int64(size)})
			total += (size + 4095) &^ 4095
		}
	}
	p.mem, p.free = be.AllocPrepared(total)
	off := 0
	for _, w := range p.want {
		p.dst = append(p.dst, p.mem[off:off+int(w.Size):off+int(w.Size)])
		off += (int(w.Size) + 4095) &^ 4095
	}
	return p
}

func (p *puller) config(env *peerEnv, a *peerNode, hash []byte) worker.PullConfig {
	return worker.PullConfig{Addr: a.w.Addr(), Identity: env.identity("b"), ContentHash: hash, Want: p.want, Dst: p.dst,
		Streams: 3, ChunkBytes: 4096}
}

// TestPullWeights: a new engine pulls every prepared weight of a peer in 1 and 3 streams
// of small chunks; the bytes are the peer's, and imported they leave nothing to pack.
func TestPullWeights(t *testing.T) {
	path := fixtures.Model(t, "stories260K-f32.gguf")
	env := newPeerEnv(t)
	a, src, met := weightsPeer(t, env, path, worker.Config{})
	for _, streams := range []int{1, 3} {
		p := newPuller(t, path)
		cfg := p.config(env, a, src.hash)
		cfg.Streams = streams
		var landed atomic.Int64
		cfg.Progress = func(n int64) { landed.Store(n) }
		peer, err := worker.PullWeights(context.Background(), cfg)
		if err != nil {
			t.Fatalf("%d streams: %v", streams, err)
		}
		if peer != "a" {
			t.Errorf("pulled from %q, want a", peer)
		}
		var total int64
		for i, w := range p.want {
			if !bytes.Equal(p.dst[i], src.forms[w.Name].Data) {
				t.Fatalf("%d streams: weight %s differs from the peer's", streams, w.Name)
			}
			total += w.Size
		}
		if landed.Load() != total {
			t.Errorf("progress ended at %d of %d bytes", landed.Load(), total)
		}
		ps := make([]hal.Prepared, len(p.ws))
		for i := range ps {
			ps[i] = hal.Prepared{Format: p.want[i].Format, Data: p.dst[i]}
		}
		if err := p.be.ImportWeights(p.ws, ps, p.free); err != nil {
			t.Fatal(err)
		}
		p.m.Prefault(p.be, nil)
		if packed, imported := p.be.PreparedCounts(); packed != 0 || imported != len(p.ws) {
			t.Errorf("%d packed, %d imported after importing a pull", packed, imported)
		}
	}
	if got := testutil.ToFloat64(met.Streams.WithLabelValues("ok")); got != 4 {
		t.Errorf("streams served ok: %v, want 4", got)
	}
}

// TestPullWeightsRefused: a pull for another model or another prepared format is refused
// with its kind, and nothing lands.
func TestPullWeightsRefused(t *testing.T) {
	path := fixtures.Model(t, "stories260K-f32.gguf")
	env := newPeerEnv(t)
	a, src, met := weightsPeer(t, env, path, worker.Config{})
	p := newPuller(t, path)
	defer p.free()

	other := bytes.Clone(src.hash)
	other[0] ^= 1
	if _, err := worker.PullWeights(context.Background(), p.config(env, a, other)); !errors.Is(err, worker.ErrPeerOtherModel) {
		t.Errorf("another model: %v", err)
	}
	cfg := p.config(env, a, src.hash)
	cfg.Want = append([]cluster.WantedWeight(nil), cfg.Want...)
	cfg.Want[0].Format = "cpu-pack/other/1"
	if _, err := worker.PullWeights(context.Background(), cfg); !errors.Is(err, worker.ErrPeerRefused) {
		t.Errorf("another format: %v", err)
	}
	if got := testutil.ToFloat64(met.Streams.WithLabelValues("refused")); got != 2 {
		t.Errorf("streams refused: %v, want 2 (the first stream of each pull: the others never start)", got)
	}
	if got := testutil.ToFloat64(met.Bytes.WithLabelValues("sent")); got != 0 {
		t.Errorf("%v bytes sent for refused pulls", got)
	}
}

// TestPullWeightsCorrupt: bytes that do not match the checksum sent with them (the
// sender's memory changed under it) fail the pull as corrupt.
func TestPullWeightsCorrupt(t *testing.T) {
	path := fixtures.Model(t, "stories260K-f32.gguf")
	env := newPeerEnv(t)
	a, src, _ := weightsPeer(t, env, path, worker.Config{})
	p := newPuller(t, path)
	defer p.free()
	if _, err := worker.PullWeights(context.Background(), p.config(env, a, src.hash)); err != nil {
		t.Fatal(err) // the worker has the checksums now
	}
	form := src.forms[p.want[0].Name]
	orig := bytes.Clone(form.Data)
	form.Data[len(form.Data)/2] ^= 0x10
	defer copy(form.Data, orig)
	if _, err := worker.PullWeights(context.Background(), p.config(env, a, src.hash)); !errors.Is(err, worker.ErrPeerCorrupt) {
		t.Errorf("a changed byte: %v", err)
	}
}

// TestPullWeightsPeerGone: a peer that goes away mid-pull fails it as lost, at once.
func TestPullWeightsPeerGone(t *testing.T) {
	path := fixtures.Model(t, "stories260K-f32.gguf")
	env := newPeerEnv(t)
	a, src, met := weightsPeer(t, env, path, worker.Config{WeightsSendRate: 64 << 10}) // ~20 s for the model
	p := newPuller(t, path)
	defer p.free()
	cfg := p.config(env, a, src.hash)
	started := make(chan struct{})
	var once atomic.Bool
	cfg.Progress = func(int64) {
		if once.CompareAndSwap(false, true) {
			close(started)
		}
	}
	errc := make(chan error, 1)
	go func() { _, err := worker.PullWeights(context.Background(), cfg); errc <- err }()
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("no chunk landed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // no grace: the running pulls are cut
	a.w.Shutdown(ctx)
	select {
	case err := <-errc:
		if !errors.Is(err, worker.ErrPeerLost) {
			t.Errorf("pull from a peer that went away: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the pull did not end after its peer went away")
	}
	if got := testutil.ToFloat64(met.Streams.WithLabelValues("failed")); got == 0 {
		t.Error("the cut streams were not counted as failed")
	}
}
