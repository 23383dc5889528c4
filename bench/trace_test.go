package bench

import (
	"encoding/binary"
	"hash/fnv"
	"os"
	"path/filepath"
	"testing"
)

// workloadsDir finds /work/shared/workloads: $TANDEM_WORKLOADS, else
// ../shared/workloads from the repository root.
func workloadsDir(t testing.TB, rel string) string {
	t.Helper()
	dir := os.Getenv("TANDEM_WORKLOADS")
	if dir == "" {
		dir = filepath.Join("..", "..", "shared", "workloads")
	}
	p := filepath.Join(dir, rel)
	if _, err := os.Stat(p); err != nil {
		t.Skipf("workload fixture %s absent (set TANDEM_WORKLOADS): %v", p, err)
	}
	return p
}

func loadTrace(t testing.TB, rel string) []TraceRow {
	t.Helper()
	f, err := os.Open(workloadsDir(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := ParseMooncake(f)
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// traceReuse is the fraction of a trace's blocks whose hash id an earlier
// block had (an infinite prefix cache's hit rate).
func traceReuse(rows []TraceRow) float64 {
	seen := map[int64]bool{}
	hits, total := 0, 0
	for _, r := range rows {
		for _, h := range r.HashIDs[:(r.InputLength+MooncakeBlockSize-1)/MooncakeBlockSize] {
			total++
			if seen[h] {
				hits++
			}
			seen[h] = true
		}
	}
	return float64(hits) / float64(total)
}

// promptReuse is the same fraction computed from rendered prompts: each
// prompt is cut into blocks of bs tokens (the last may be short), a block is
// named by a hash chained over its prefix, and a hit is a name seen before.
func promptReuse(w Workload, r *Renderer, bs int) float64 {
	seen := map[uint64]bool{}
	hits, total := 0, 0
	buf := make([]byte, 4)
	for _, s := range w.Sessions() {
		ids := r.IDs(s.Turns[0].Segments)
		var parent uint64
		for i := 0; i < len(ids); i += bs {
			h := fnv.New64a()
			var p [8]byte
			binary.LittleEndian.PutUint64(p[:], parent)
			h.Write(p[:])
			for _, id := range ids[i:min(i+bs, len(ids))] {
				binary.LittleEndian.PutUint32(buf, uint32(id))
				h.Write(buf)
			}
			parent = h.Sum64()
			total++
			if seen[parent] {
				hits++
			}
			seen[parent] = true
		}
	}
	return float64(hits) / float64(total)
}

func TestMooncakeReplayKeepsBlockReuse(t *testing.T) {
	rows := loadTrace(t, "mooncake/conversation_trace.jsonl")
	if len(rows) != 12031 {
		t.Fatalf("conversation trace: %d rows, want 12031", len(rows))
	}
	n := 3000 // enough to share many prefixes, quick to render
	if testing.Short() {
		n = 500
	}
	want := traceReuse(rows[:n])
	if want < 0.05 {
		t.Fatalf("the trace's first %d rows reuse only %.3f of their blocks; test needs reuse", n, want)
	}
	r := &Renderer{TokenIDs: make([]int32, 3000)}
	for i := range r.TokenIDs {
		r.TokenIDs[i] = int32(100 + i)
	}
	for _, bs := range []int{MooncakeBlockSize, 32} {
		w, err := Mooncake(rows, MooncakeOptions{N: n, BlockSize: bs, Seed: 7})
		if err != nil {
			t.Fatal(err)
		}
		if got := len(w.Sessions()); got != n {
			t.Fatalf("block size %d: %d sessions, want %d", bs, got, n)
		}
		got := promptReuse(w, r, bs)
		t.Logf("block size %d: trace reuse %.4f, replayed prompts %.4f", bs, want, got)
		if got != want {
			t.Errorf("block size %d: replayed prompts reuse %.6f of their blocks, the trace %.6f", bs, got, want)
		}
	}
	// Whole trace, block reuse as the README states (0.366).
	if all := traceReuse(rows); all < 0.36 || all > 0.37 {
		t.Errorf("whole-trace block reuse %.4f, README says 0.366", all)
	}
}
