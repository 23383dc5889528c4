//go:build linux

package model_test

import (
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/model"
	"tandem/modelgen"
)

// status reads a size field of /proc/self/status (VmRSS, VmHWM) in bytes.
func status(t *testing.T, field string) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skipf("no /proc/self/status to read resident memory from: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field+":" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatalf("%s: %v", field, err)
			}
			return kb << 10
		}
	}
	t.Skipf("/proc/self/status has no %s", field)
	return 0
}

// TestResidentMemoryTracksWeights loads a mapped model with a large tied
// embedding, prepares its weights and runs a prompt whose tokens are spread
// over the whole vocabulary, and checks that the process's resident memory
// grew, both at the end and at its peak, by no more than the weight file
// plus the KV store plus a tenth (issue 4's target) and a little fixed
// slack for the heap: the file's pages must not stay resident beside the
// backend's packed copies, neither while packing nor after rows of the
// tied embedding are read for Embed. Deltas of the test process's own
// counters, so other processes on the machine do not matter.
func TestResidentMemoryTracksWeights(t *testing.T) {
	spec := modelgen.Spec{Arch: "llama", Name: "rss-test", Embd: 512, Layers: 2, Heads: 8, KVHeads: 2, HeadDim: 64, FFN: 1024,
		VocabSize: 32768, ContextLen: 256, RopeBase: 10000, NormEps: 1e-5, Tied: true, Type: "q8_0", Seed: 7}
	path := filepath.Join(t.TempDir(), "m.gguf")
	w, err := modelgen.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	w = nil
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	debug.FreeOSMemory()
	// Writing 5 to clear_refs resets the peak (VmHWM) to the current size.
	peakReset := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
	rss0, file0, anon0 := status(t, "VmRSS"), status(t, "RssFile"), status(t, "RssAnon")

	be := cpu.New(2)
	defer be.Close()
	m, err := model.Load(path, be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.Prefault(be, nil)
	const n, bs = 128, 16
	kv, err := be.NewKVStore(m.KVLayout(n/bs, bs))
	if err != nil {
		t.Fatal(err)
	}
	b := &model.Batch{Attn: hal.AttnBatch{Blocks: [][]int32{make([]int32, n/bs)}}, Outputs: []int{n - 1}}
	for i := range n / bs {
		b.Attn.Blocks[0][i] = int32(i)
	}
	for i := range n {
		b.Tokens = append(b.Tokens, int32(i*(spec.VocabSize/n)+i%7))
		b.Attn.Pos = append(b.Attn.Pos, int32(i))
		b.Attn.SeqOf = append(b.Attn.SeqOf, 0)
	}
	logits := make([]float32, spec.VocabSize)
	if err := model.NewRunner(m, be).Forward(kv, b, logits); err != nil {
		t.Fatal(err)
	}
	rss1, peak1 := status(t, "VmRSS"), status(t, "VmHWM")

	file1, anon1 := status(t, "RssFile"), status(t, "RssAnon")

	allowed := st.Size() + kv.Bytes()
	allowed += allowed/10 + 12<<20
	t.Logf("file %.1f MiB, KV %.1f MiB: resident +%.1f MiB (anonymous +%.1f, file +%.1f), peak +%.1f MiB (allowed +%.1f MiB)",
		float64(st.Size())/(1<<20), float64(kv.Bytes())/(1<<20), float64(rss1-rss0)/(1<<20),
		float64(anon1-anon0)/(1<<20), float64(file1-file0)/(1<<20), float64(peak1-rss0)/(1<<20), float64(allowed)/(1<<20))
	if rss1-rss0 > allowed {
		t.Errorf("resident memory grew by %d bytes, more than the weight file and KV allow (%d)", rss1-rss0, allowed)
	}
	if peakReset && peak1-rss0 > allowed {
		t.Errorf("resident memory peaked %d bytes above the start, more than the weight file and KV allow (%d)", peak1-rss0, allowed)
	}
	runtime.KeepAlive(logits)
}
