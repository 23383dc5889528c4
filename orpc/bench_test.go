package orpc

import (
	"context"
	"io"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkUnaryCall measures the round trip of a small unary call on loopback (one call at a
// time, so ns/op is the latency) and, with -cpu, of parallel calls over one connection.
func BenchmarkUnaryCall(b *testing.B) {
	env := newEnv(b, func(s *Server) {
		s.HandleUnary("bench.Echo", func(ctx context.Context, req []byte) ([]byte, error) { return req, nil })
	})
	c := dial(b, env.addr, env.cliID)
	ctx := context.Background()
	req := make([]byte, 64)
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.CallBytes(ctx, "bench.Echo", req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := c.CallBytes(ctx, "bench.Echo", req); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkStreamThroughput measures server-streaming throughput (MB/s) on loopback for a few
// message sizes; each op is one message.
func BenchmarkStreamThroughput(b *testing.B) {
	for _, size := range []int{64, 4 << 10, 64 << 10, 1 << 20} {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			var count atomic.Int64
			env := newEnv(b, func(s *Server) {
				s.HandleStream("bench.Flood", func(ctx context.Context, req []byte, send func([]byte) error) error {
					msg := make([]byte, size)
					n := count.Load()
					for range n {
						if err := send(msg); err != nil {
							return err
						}
					}
					return nil
				})
			})
			c := dial(b, env.addr, env.cliID)
			count.Store(int64(b.N))
			b.SetBytes(int64(size))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			b.ResetTimer()
			cs, err := c.StreamBytes(ctx, "bench.Flood", nil)
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for {
				_, err := cs.Recv()
				if err == io.EOF {
					break
				}
				if err != nil {
					b.Fatal(err)
				}
				n++
			}
			if n != b.N {
				b.Fatalf("got %d messages, want %d", n, b.N)
			}
		})
	}
}
