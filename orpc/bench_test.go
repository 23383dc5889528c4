package orpc

import (
	"context"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tandem/internal/costs"
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
			n, err := recvAll(cs, nil)
			if err != nil {
				b.Fatal(err)
			}
			if n != b.N {
				b.Fatalf("got %d messages, want %d", n, b.N)
			}
		})
	}
}

// BenchmarkStreamTokens streams token-sized messages (24 bytes, a GenerateEvent's) on
// several calls of one connection in steps, as an engine's decode steps make them: every
// step wakes every call's handler, which sends one message, and the next step begins
// once the client has read them all. One op is one message. cpu-ns/msg is the process's
// CPU (both ends) per message; datagrams/msg counts UDP datagrams sent on the host (both
// ends: the messages' packets and their ACKs), which is what a router pays per token.
func BenchmarkStreamTokens(b *testing.B) {
	for _, streams := range []int{1, 4, 16} {
		b.Run("streams="+strconv.Itoa(streams), func(b *testing.B) {
			var (
				mu      sync.Mutex
				wakes   []chan struct{}
				steps   atomic.Int64
				started sync.WaitGroup
			)
			started.Add(streams)
			env := newEnv(b, func(s *Server) {
				s.HandleStream("bench.Tokens", func(ctx context.Context, req []byte, send func([]byte) error) error {
					wake := make(chan struct{}, 1)
					mu.Lock()
					wakes = append(wakes, wake)
					mu.Unlock()
					started.Done()
					msg := make([]byte, 24)
					for range steps.Load() {
						select {
						case <-wake:
						case <-ctx.Done():
							return ctx.Err()
						}
						if err := send(msg); err != nil {
							return err
						}
					}
					return nil
				})
			})
			c := dial(b, env.addr, env.cliID)
			n := (b.N + streams - 1) / streams
			steps.Store(int64(n))
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			got := make(chan struct{}, streams)
			var readers sync.WaitGroup
			for range streams {
				cs, err := c.StreamBytes(ctx, "bench.Tokens", nil)
				if err != nil {
					b.Fatal(err)
				}
				readers.Add(1)
				go func() {
					defer readers.Done()
					var m Bytes
					for {
						if err := cs.RecvMsgReusing(&m); err != nil {
							if err != io.EOF {
								b.Error(err)
							}
							return
						}
						got <- struct{}{}
					}
				}()
			}
			started.Wait()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0, dg0 := costs.ProcessCPU(), costs.UDPDatagramsSent()
			for range n {
				mu.Lock()
				for _, w := range wakes {
					w <- struct{}{}
				}
				mu.Unlock()
				for range streams {
					<-got
				}
			}
			b.StopTimer()
			msgs := float64(n * streams)
			b.ReportMetric(float64(costs.ProcessCPU()-cpu0)/msgs, "cpu-ns/msg")
			b.ReportMetric(float64(costs.UDPDatagramsSent()-dg0)/msgs, "datagrams/msg")
			readers.Wait()
		})
	}
}
