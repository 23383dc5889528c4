package worker_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"tandem/cluster"
	"tandem/kvcache"
	"tandem/llm"
	"tandem/modelgen"
	"tandem/orpc"
	"tandem/worker"
)

// benchModel writes a random-weight model of contextLen tokens whose KV blocks are as large
// as a 0.5B model's: 12 layers, 4 KV heads of 64 → 393,216 bytes per block of 16.
func benchModel(b *testing.B, contextLen int) string {
	b.Helper()
	spec := modelgen.Demo
	spec.Embd, spec.Layers, spec.Heads, spec.KVHeads, spec.HeadDim, spec.FFN, spec.ContextLen = 768, 12, 12, 4, 64, 2048, contextLen
	spec.Type = "q8_0"
	w, err := modelgen.Build(spec)
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "bench.gguf")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := w.WriteTo(f); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	return path
}

// BenchmarkKVPull measures Worker.PullKV on loopback — one op pulls a 1,000-token prompt's
// 62 blocks (24 MiB) from a prefill worker, checking each block's CRC — against a plain
// QUIC stream carrying the same bytes in block-sized writes, with the same flow-control
// windows. MB/s is the transfer throughput.
func BenchmarkKVPull(b *testing.B) {
	path := benchModel(b, 2048)
	b.Run("orpc-pull", func(b *testing.B) { benchPull(b, path) })
	b.Run("quic-bulk", func(b *testing.B) { benchQUIC(b, 62, 393216) })
}

func benchPull(b *testing.B, path string) {
	env := newPeerEnv(b)
	p := env.start("p", path, worker.Config{KVHold: time.Hour})
	pc := env.dial(p)
	ctx := context.Background()
	prompt := p.m.Tokenizer.Encode(strings.Repeat("a long prompt of a thousand tokens. ", 28), false, false)[:1000]
	var rep cluster.PrefillReply
	if err := pc.Call(ctx, cluster.MethodPrefill, &cluster.PrefillRequest{HoldMs: int(time.Hour / time.Millisecond),
		Generate: cluster.GenerateRequest{Request: llm.Request{Prompt: prompt, MaxTokens: 8}}}, &rep); err != nil || rep.Handle == 0 {
		b.Fatalf("prefill: %+v %v", rep, err)
	}
	hashes := kvcache.HashBlocks(p.eng.Config().Salt, prompt, 16, nil)
	f, err := p.eng.KVFormat()
	if err != nil {
		b.Fatal(err)
	}
	size := len(hashes) * f.BlockBytes()
	b.SetBytes(int64(size))
	b.ResetTimer()
	for b.Loop() {
		cs, err := pc.Stream(ctx, cluster.MethodPullKV, &cluster.PullRequest{Handle: rep.Handle, Layout: rep.Layout, Hashes: hashes})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		var blk cluster.KVBlock
		for {
			err := cs.RecvMsg(&blk)
			if errors.Is(err, io.EOF) {
				break
			}
			if err == nil {
				err = blk.Verify()
			}
			if err != nil {
				b.Fatal(err)
			}
			n += len(blk.Data)
		}
		if n != size {
			b.Fatalf("pulled %d bytes, want %d", n, size)
		}
	}
	b.ReportMetric(float64(len(hashes)), "blocks/op")
}

func benchQUIC(b *testing.B, blocks, blockBytes int) {
	ca, err := orpc.NewCA("bench")
	if err != nil {
		b.Fatal(err)
	}
	id, err := ca.NewIdentity("bench", []string{"127.0.0.1"})
	if err != nil {
		b.Fatal(err)
	}
	cert := tls.Certificate{Certificate: [][]byte{id.Cert.Raw}, PrivateKey: id.Key}
	// The windows of ORPC's connections (orpc/options.go), so only the protocol differs.
	qc := &quic.Config{InitialStreamReceiveWindow: 1 << 20, MaxStreamReceiveWindow: 16 << 20,
		InitialConnectionReceiveWindow: 2 << 20, MaxConnectionReceiveWindow: 64 << 20}
	l, err := quic.ListenAddr("127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"bulk"}, MinVersion: tls.VersionTLS13}, qc)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		conn, err := l.Accept(ctx)
		if err != nil {
			return
		}
		buf := make([]byte, blockBytes)
		for {
			st, err := conn.AcceptStream(ctx)
			if err != nil {
				return
			}
			for range blocks {
				if _, err := st.Write(buf); err != nil {
					break
				}
			}
			st.Close()
		}
	}()
	conn, err := quic.DialAddr(ctx, l.Addr().String(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"bulk"}, MinVersion: tls.VersionTLS13}, qc)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.CloseWithError(0, "")
	b.SetBytes(int64(blocks * blockBytes))
	buf := make([]byte, 64<<10)
	b.ResetTimer()
	for b.Loop() {
		st, err := conn.OpenStreamSync(ctx)
		if err != nil {
			b.Fatal(err)
		}
		st.Write([]byte{1}) // the server accepts a stream once it carries data
		n := 0
		for {
			k, err := st.Read(buf)
			n += k
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		if n != blocks*blockBytes {
			b.Fatalf("read %d bytes", n)
		}
	}
}
