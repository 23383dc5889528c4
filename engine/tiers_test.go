package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"tandem/kvcache"
	"tandem/kvtier"
	"tandem/llm"
)

// The stories260K model's KV block: 5 layers × K and V × 16 positions × 4 heads × 8 dims × 4
// bytes, and its block file (a 4096-byte header and the block).
const (
	storiesBlock = 5 * 2 * 16 * 4 * 8 * 4
	storiesFile  = 4096 + storiesBlock
)

// longPrompts are prompts of 7 blocks and 3 tokens, each its own (no shared prefix).
func longPrompts(t *testing.T, e *Engine) [][]int32 {
	var out [][]int32
	for i, s := range []string{
		"Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends every day.",
		"Tim had a big red ball. He liked to kick it high in the sky and run after it across the green grass near his house.",
		"The sun was hot and the birds were singing in the tall green trees near the river where the fish swam all day long.",
		"One day a little boy named Sam found a shiny stone in the garden. He picked it up and showed it to his mom and dad.",
	} {
		p := e.Model().Tokenizer.Encode(strings.Repeat(s+" ", 4), true, false)
		if len(p) < 115 {
			t.Fatalf("prompt %d has %d tokens", i, len(p))
		}
		out = append(out, p[:115]) // 7 blocks and 3 tokens

	}
	return out
}

// tierEngine starts an engine with a device pool of 10 blocks (one prompt at a time) and
// the given lower tiers.
func tierEngine(t *testing.T, tiers kvtier.Config) (*Engine, context.CancelFunc, chan struct{}) {
	t.Helper()
	m, be := loadStories(t)
	e, err := New(m, be, Config{KVBlocks: 10, Tiers: tiers, ModelID: 42})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e, cancel, done
}

// reference returns each prompt's greedy tokens on an engine without tiers.
func reference(t *testing.T, prompts [][]int32, n int) [][]int32 {
	e, _ := startEngine(t, Config{})
	var out [][]int32
	for _, p := range prompts {
		ids, _ := collectReq(t, e, &llm.Request{Prompt: p, MaxTokens: n, IgnoreEOS: true})
		out = append(out, ids)
	}
	return out
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func tierStats(e *Engine, tier kvcache.Tier) kvcache.TierStats {
	for _, s := range e.Pool().TierStats() {
		if s.Tier == tier {
			return s
		}
	}
	return kvcache.TierStats{}
}

// A prompt whose blocks left the device is served from host memory, and after a restart
// from the disk tier, with the tokens of an engine that computes it, bit for bit; the
// onboarded blocks count as cached tokens.
func TestTiersServeSameOutput(t *testing.T) {
	const n = 12
	dir := t.TempDir()
	cfg := kvtier.Config{HostBytes: 64 * storiesBlock, DiskDir: dir, DiskBytes: 256 * storiesFile}
	e, stop, done := tierEngine(t, cfg)
	ps := longPrompts(t, e)
	want := reference(t, ps, n)
	run := func(e *Engine, i int) llm.Event {
		t.Helper()
		ids, last := collectReq(t, e, &llm.Request{Prompt: ps[i], MaxTokens: n, IgnoreEOS: true})
		if !slices.Equal(ids, want[i]) {
			t.Fatalf("prompt %d: %v, computed %v", i, ids, want[i])
		}
		return last
	}
	for i := range ps {
		run(e, i) // each evicts the one before it to host memory
	}
	last := run(e, 0)
	if last.Usage.CachedTokens < 6*16 {
		t.Fatalf("prompt 0 again: %d cached tokens, want its blocks from host memory", last.Usage.CachedTokens)
	}
	if st := e.Pool().Stats(); st.Onboarded == 0 || tierStats(e, kvcache.TierHost).Onboarded == 0 {
		t.Fatalf("nothing onboarded: %+v", st)
	}
	// Used twice, prompt 0's blocks go down to disk.
	waitFor(t, "blocks on disk", func() bool { return tierStats(e, kvcache.TierDisk).Ready >= 6 })
	waitIdle(t, e)
	stop()
	<-done

	// A new engine on the same disk directory: its blocks are re-indexed and announced.
	e2, _, _ := tierEngine(t, cfg)
	if got := tierStats(e2, kvcache.TierDisk).Ready; got < 6 {
		t.Fatalf("restart re-indexed %d blocks", got)
	}
	if e2.Tiers().Scan.Restored < 6 {
		t.Fatalf("scan %+v", e2.Tiers().Scan)
	}
	snap := e2.Pool().Snapshot()
	if len(snap.Lower) < 2 || len(snap.Lower[1].Blocks) < 6 {
		t.Fatalf("restored blocks not in the snapshot: %+v", snap.Lower)
	}
	last = run(e2, 0)
	if last.Usage.CachedTokens < 6*16 || tierStats(e2, kvcache.TierDisk).Onboarded == 0 {
		t.Fatalf("after restart: %d cached tokens, disk %+v", last.Usage.CachedTokens, tierStats(e2, kvcache.TierDisk))
	}
	waitIdle(t, e2)
}

// Every fault of the disk tier is detected, counted and served by recomputing, with the
// tokens of an engine that computes the prompt: corrupt, truncated, deleted and foreign
// block files, and the directory gone (after which blocks are refused until it is back).
func TestTierFaultsRecompute(t *testing.T) {
	const n = 8
	for _, fault := range []string{"corrupt", "truncated", "deleted", "foreign", "gone"} {
		t.Run(fault, func(t *testing.T) {
			dir := t.TempDir()
			cfg := kvtier.Config{HostBytes: 64 * storiesBlock, DiskDir: dir, DiskBytes: 256 * storiesFile, DiskMinUses: 1}
			e, stop, done := tierEngine(t, cfg)
			ps := longPrompts(t, e)
			want := reference(t, ps, n)
			for i := range ps {
				collectReq(t, e, &llm.Request{Prompt: ps[i], MaxTokens: n, IgnoreEOS: true})
			}
			waitFor(t, "blocks on disk", func() bool {
				return tierStats(e, kvcache.TierDisk).Ready >= 14
			})
			waitIdle(t, e)
			stop()
			<-done
			files, _ := filepath.Glob(filepath.Join(dir, "*.kvb"))
			if len(files) < 14 {
				t.Fatalf("%d block files", len(files))
			}
			// A new engine whose host tier is empty: prompt 0 would come from disk.
			e2, _, _ := tierEngine(t, cfg)
			for _, f := range files {
				switch fault {
				case "corrupt":
					b, _ := os.ReadFile(f)
					b[4096+100] ^= 0xff
					os.WriteFile(f, b, 0o600)
				case "truncated":
					os.Truncate(f, 4096+1000)
				case "deleted":
					os.Remove(f)
				case "foreign":
					b, _ := os.ReadFile(f)
					b[40] ^= 1 // the weights' fingerprint: another model's block, its header checksum fixed
					fixHeader(b)
					os.WriteFile(f, b, 0o600)
				}
			}
			if fault == "gone" {
				os.RemoveAll(dir)
			}
			for i := range ps {
				ids, last := collectReq(t, e2, &llm.Request{Prompt: ps[i], MaxTokens: n, IgnoreEOS: true})
				if !slices.Equal(ids, want[i]) {
					t.Fatalf("prompt %d after %s block files: %v, computed %v", i, fault, ids, want[i])
				}
				if i == 0 && last.Usage.CachedTokens != 0 {
					t.Fatalf("prompt 0 counted %d cached tokens from bad blocks", last.Usage.CachedTokens)
				}
			}
			kinds := map[string]uint64{}
			for _, f := range e2.Tiers().Faults() {
				if f.Tier == kvcache.TierDisk && f.Op == "read" {
					kinds[f.Kind] += f.Count
				}
			}
			wantKind := map[string]string{"corrupt": "corrupt", "truncated": "corrupt", "deleted": "missing", "foreign": "mismatch", "gone": "gone"}[fault]
			if kinds[wantKind] == 0 {
				t.Fatalf("faults %v, want %s counted", kinds, wantKind)
			}
			if st := tierStats(e2, kvcache.TierDisk); fault != "gone" && st.Bad == 0 {
				t.Fatalf("no bad block dropped: %+v", st)
			}
			if fault == "gone" {
				if !e2.Tiers().Down(kvcache.TierDisk) || tierStats(e2, kvcache.TierDisk).Ready != 0 {
					t.Fatalf("directory gone: down %v, disk %+v", e2.Tiers().Down(kvcache.TierDisk), tierStats(e2, kvcache.TierDisk))
				}
				os.MkdirAll(dir, 0o700)
				waitFor(t, "the disk tier back", func() bool { return !e2.Tiers().Down(kvcache.TierDisk) })
			}
			waitIdle(t, e2)
		})
	}
}

// fixHeader rewrites a block file header's checksum after a test changed a field.
func fixHeader(b []byte) {
	crc := kvtier.CRC(b[:4092])
	b[4092], b[4093], b[4094], b[4095] = byte(crc), byte(crc>>8), byte(crc>>16), byte(crc>>24)
}

// A full disk: every write of a block file fails with ENOSPC (its temporary file is made
// /dev/full, the device that is always full). The failures are counted, the disk tier
// refuses new blocks until its probe succeeds, and requests are served as computed.
func TestTierDiskFull(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full on this system, the one device that is always full")
	}
	const n = 8
	dir := t.TempDir()
	cfg := kvtier.Config{HostBytes: 64 * storiesBlock, DiskDir: dir, DiskBytes: 64 * storiesFile, DiskMinUses: 1}
	e, _, _ := tierEngine(t, cfg)
	for slot := range 64 {
		if err := os.Symlink("/dev/full", filepath.Join(dir, fmt.Sprintf("%08d.kvb.tmp", slot))); err != nil {
			t.Fatal(err)
		}
	}
	ps := longPrompts(t, e)
	want := reference(t, ps, n)
	for round := range 2 {
		for i := range ps {
			ids, _ := collectReq(t, e, &llm.Request{Prompt: ps[i], MaxTokens: n, IgnoreEOS: true})
			if !slices.Equal(ids, want[i]) {
				t.Fatalf("round %d, prompt %d on a full disk: %v, computed %v", round, i, ids, want[i])
			}
		}
	}
	waitFor(t, "a full disk counted", func() bool {
		for _, f := range e.Tiers().Faults() {
			if f.Tier == kvcache.TierDisk && f.Op == "write" && f.Kind == "full" {
				return true
			}
		}
		return false
	})
	// Blocks may be stored after all: a failed write removes its temporary file (the link
	// to /dev/full), and the probe a second later lets the tier back in (slow runs, -race).
	if st := tierStats(e, kvcache.TierDisk); st.Failed == 0 {
		t.Fatalf("disk tier on a full disk: %+v", st)
	}
	waitIdle(t, e)
}

// Under concurrency, with a device pool too small for the prompts at once (they preempt,
// evict to host memory and disk, and onboard each other's evicted prefixes while others
// compute), every request gets the tokens of an engine that computes it alone.
func TestTiersConcurrentSameOutput(t *testing.T) {
	const n, rounds = 8, 3
	cfg := kvtier.Config{HostBytes: 16 * storiesBlock, DiskDir: t.TempDir(), DiskBytes: 256 * storiesFile, DiskMinUses: 1}
	e, _, _ := tierEngine(t, cfg)
	ps := longPrompts(t, e)
	// Pairs of prompts that share a prefix: a continuation of each, so onboarding serves
	// the shared part to whichever comes later.
	for _, p := range ps[:4] {
		q := slices.Clone(p[:96])
		ps = append(ps, append(q, p[len(p)-7:]...))
	}
	want := reference(t, ps, n)
	errs := make(chan error, len(ps)*rounds)
	var wg sync.WaitGroup
	for r := range rounds {
		for i := range ps {
			wg.Go(func() {
				st, err := e.Generate(context.Background(), &llm.Request{Prompt: ps[i], MaxTokens: n, IgnoreEOS: true})
				if err != nil {
					errs <- fmt.Errorf("round %d prompt %d: %w", r, i, err)
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				var ids []int32
				for {
					ev, err := st.Next(ctx)
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						errs <- fmt.Errorf("round %d prompt %d: %w", r, i, err)
						return
					}
					ids = append(ids, ev.Token)
				}
				if !slices.Equal(ids, want[i]) {
					errs <- fmt.Errorf("round %d prompt %d: %v, computed alone %v", r, i, ids, want[i])
				}
			})
		}
		wg.Wait()
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if st := e.Pool().Stats(); st.Onboarded == 0 {
		t.Errorf("nothing onboarded: %+v", st)
	}
	waitIdle(t, e)
}
