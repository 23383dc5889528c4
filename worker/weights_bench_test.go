package worker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"tandem/cluster"
	"tandem/hal"
	"tandem/internal/fixtures"
	"tandem/worker"
)

// BenchmarkPullWeights measures Worker.PullWeights on loopback: 64 MiB of prepared forms
// in 16 weights (random bytes: the transport is what is measured), by streams and chunk
// size, CRCs checked. MB/s is the pull's throughput.
func BenchmarkPullWeights(b *testing.B) {
	env := newPeerEnv(b)
	path := fixtures.Model(b, "stories260K-f32.gguf")
	src := &exported{hash: []byte("bench model"), forms: map[string]hal.Prepared{}}
	r := rand.New(rand.NewPCG(1, 2))
	var want []cluster.WantedWeight
	for i := range 16 {
		data := make([]byte, 4<<20)
		for j := range data {
			data[j] = byte(r.Uint32())
		}
		name := fmt.Sprintf("w%d", i)
		src.forms[name] = hal.Prepared{Format: "bench/1", Data: data}
		want = append(want, cluster.WantedWeight{Name: name, Format: "bench/1", Size: int64(len(data))})
	}
	a := env.start("a", path, worker.Config{Weights: src})
	dst := make([][]byte, len(want))
	for i, w := range want {
		dst[i] = make([]byte, w.Size)
	}
	id := env.identity("b")
	for _, streams := range []int{1, 2, 4} {
		for _, chunk := range []int{1 << 20, 4 << 20} {
			b.Run(fmt.Sprintf("streams=%d/chunk=%dMiB", streams, chunk>>20), func(b *testing.B) {
				b.SetBytes(64 << 20)
				for b.Loop() {
					_, err := worker.PullWeights(context.Background(), worker.PullConfig{Addr: a.w.Addr(), Identity: id, ContentHash: src.hash,
						Want: want, Dst: dst, Streams: streams, ChunkBytes: chunk})
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
