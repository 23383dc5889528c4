package pipeline

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"

	"tandem/orpc"
)

// BenchmarkTransport measures what a stage link costs per step on loopback: a message of
// the given size one way (a step's activations, or its logits coming back) and an 8-byte
// answer, over an ORPC unary call (QUIC with mutual TLS), over TLS 1.3 on TCP (what the
// links use) and over plain TCP. MB/s is the message's throughput.
func BenchmarkTransport(b *testing.B) {
	ca, err := orpc.NewCA("bench")
	if err != nil {
		b.Fatal(err)
	}
	srvID, _ := ca.NewIdentity("srv", []string{"127.0.0.1"})
	cliID, _ := ca.NewIdentity("cli", nil)
	for _, size := range []int{64 << 10, 1 << 20, 8 << 20} {
		b.Run(fmt.Sprintf("orpc/%dKiB", size>>10), func(b *testing.B) { benchORPC(b, srvID, cliID, size) })
		b.Run(fmt.Sprintf("tls-tcp/%dKiB", size>>10), func(b *testing.B) {
			benchTCP(b, size, linkServerTLS(srvID.ServerTLS()), linkClientTLS(cliID.ClientTLS()))
		})
		b.Run(fmt.Sprintf("tcp/%dKiB", size>>10), func(b *testing.B) { benchTCP(b, size, nil, nil) })
	}
}

func benchORPC(b *testing.B, srvID, cliID *orpc.Identity, size int) {
	srv := orpc.NewServer(orpc.WithMaxFrameSize(16 << 20))
	ack := make([]byte, 8)
	srv.HandleUnary("bench.Step", func(_ context.Context, req []byte) ([]byte, error) { return ack, nil })
	l, err := srv.Listen("127.0.0.1:0", srvID.ServerTLS())
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Serve(ctx, l)
	c, err := orpc.Dial(ctx, l.Addr().String(), cliID.ClientTLS(), orpc.WithMaxFrameSize(16<<20))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	msg := make([]byte, size)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.CallBytes(ctx, "bench.Step", msg); err != nil {
			b.Fatal(err)
		}
	}
}

func benchTCP(b *testing.B, size int, srvTLS, cliTLS *tls.Config) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		if srvTLS != nil {
			c = tls.Server(c, srvTLS)
		}
		defer c.Close()
		buf := make([]byte, size+4)
		ack := make([]byte, 8)
		for {
			if _, err := io.ReadFull(c, buf[:4]); err != nil {
				return
			}
			n := binary.LittleEndian.Uint32(buf)
			if _, err := io.ReadFull(c, buf[:n]); err != nil {
				return
			}
			if _, err := c.Write(ack); err != nil {
				return
			}
		}
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	if cliTLS != nil {
		c = tls.Client(c, cliTLS)
	}
	defer c.Close()
	msg := make([]byte, size+4)
	binary.LittleEndian.PutUint32(msg, uint32(size))
	ack := make([]byte, 8)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, ack); err != nil {
			b.Fatal(err)
		}
	}
}
