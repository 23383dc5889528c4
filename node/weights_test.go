package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"tandem/cluster"
)

// startDemo starts a node on the demo model with w and returns it with its backend's
// counts of weights packed and imported once it serves.
func startDemo(t *testing.T, w Weights) (n *Node, packed, imported int) {
	t.Helper()
	m, be := demoModel(t)
	n, err := Start(context.Background(), Config{Model: m, Backend: be, Name: "tandem-demo", KVBudget: 64 * 16 * m.KVBytesPerToken(),
		HTTP: HTTP{Addr: "127.0.0.1:0"}, Logger: quiet, Weights: w})
	if err != nil {
		t.Fatal(err)
	}
	packed, imported = be.PreparedCounts()
	return n, packed, imported
}

func stopNode(t *testing.T, n *Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPackCacheStarts: the first node prepares its weights and writes the pack cache, the
// second maps them from it and packs none; a damaged cache is counted and rebuilt; the
// phases and sources are on /metrics and in the report.
func TestPackCacheStarts(t *testing.T) {
	dir := t.TempDir()
	n, packed, _ := startDemo(t, Weights{PackCache: dir})
	if packed == 0 {
		t.Skip("the backend packs none of the demo model's weights on this CPU: nothing to cache")
	}
	st := n.Startup()
	if st.Weights != cluster.WeightsFile || st.Packed != packed {
		t.Errorf("first start: %+v", st)
	}
	stopNode(t, n) // waits for the cache's write
	caches, _ := filepath.Glob(filepath.Join(dir, "*.tpack"))
	if len(caches) != 1 {
		t.Fatalf("pack caches after the first start: %v", caches)
	}

	n, packed2, imported := startDemo(t, Weights{PackCache: dir})
	if st := n.Startup(); st.Weights != cluster.WeightsPackCache || packed2 != 0 || imported != packed {
		t.Errorf("second start: %+v, %d packed, %d imported; want all %d from the cache", st, packed2, imported, packed)
	}
	var phases []string
	for _, p := range n.Startup().Phases {
		phases = append(phases, p.Name)
	}
	if got := strings.Join(phases, ","); got != "hash,weights,engine" {
		t.Errorf("phases %s", got)
	}
	if v := testutil.ToFloat64(n.startupMet.Source.WithLabelValues(cluster.WeightsPackCache)); v != 1 {
		t.Errorf("tandem:startup_weights_source{source=pack-cache} = %v", v)
	}
	stopNode(t, n)

	if err := os.WriteFile(caches[0], []byte("TNDMPACK garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	n, packed3, _ := startDemo(t, Weights{PackCache: dir})
	if st := n.Startup(); st.Weights != cluster.WeightsFile || packed3 != packed || len(st.Fallbacks) != 1 || st.Fallbacks[0] != "pack-cache: corrupt" {
		t.Errorf("damaged cache: %+v", st)
	}
	if v := testutil.ToFloat64(n.startupMet.Fallbacks.WithLabelValues("pack-cache", "corrupt")); v != 1 {
		t.Errorf("fallbacks{pack-cache,corrupt} = %v", v)
	}
	stopNode(t, n)
	if fi, err := os.Stat(caches[0]); err != nil || fi.Size() < 1<<10 {
		t.Errorf("the damaged cache was not rebuilt: %v %v", fi, err)
	}
}

// TestWeightsFromNeedsJoin: a peer named without cluster membership is given up, counted,
// and the file's weights are used.
func TestWeightsFromNeedsJoin(t *testing.T) {
	n, _, _ := startDemo(t, Weights{From: []string{"127.0.0.1:9"}})
	defer stopNode(t, n)
	if st := n.Startup(); st.Weights != cluster.WeightsFile || len(st.Fallbacks) != 1 || st.Fallbacks[0] != "peer: not_a_member" {
		t.Errorf("%+v", st)
	}
}
