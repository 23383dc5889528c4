package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"time"

	"tandem/orpc"
	"tandem/sim"
)

// transferChunk is the message size of the timed transfers: KV moves as a stream of
// block batches, not as one message.
const transferChunk = 1 << 20

// profileTransfers times KV-sized transfers over loopback ORPC (QUIC with mutual TLS, as
// between a prefill and a decode worker on one host): for each size, the median of reps
// server-streamed transfers, from the call to the last byte, on one warm connection.
func profileTransfers(ctx context.Context, sizes []int64, reps int) ([]sim.TransferSample, error) {
	ca, err := orpc.NewCA("tandem profile")
	if err != nil {
		return nil, err
	}
	srvID, err := ca.NewIdentity("server", []string{"127.0.0.1"})
	if err != nil {
		return nil, err
	}
	cliID, err := ca.NewIdentity("client", nil)
	if err != nil {
		return nil, err
	}
	quiet := orpc.WithLogger(slog.New(slog.DiscardHandler))
	srv := orpc.NewServer(quiet)
	srv.HandleStream("profile.Pull", func(ctx context.Context, req []byte, send func([]byte) error) error {
		if len(req) != 8 {
			return errors.New("want a size")
		}
		left := int64(binary.LittleEndian.Uint64(req))
		msg := make([]byte, transferChunk)
		for left > 0 {
			n := min(left, transferChunk)
			if err := send(msg[:n]); err != nil {
				return err
			}
			left -= n
		}
		return nil
	})
	l, err := srv.Listen("127.0.0.1:0", srvID.ServerTLS())
	if err != nil {
		return nil, err
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	go srv.Serve(sctx, l)
	c, err := orpc.Dial(ctx, l.Addr().String(), cliID.ClientTLS(), quiet)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	pull := func(size int64) (time.Duration, error) {
		req := binary.LittleEndian.AppendUint64(nil, uint64(size))
		t0 := time.Now()
		cs, err := c.StreamBytes(ctx, "profile.Pull", req)
		if err != nil {
			return 0, err
		}
		defer cs.Close()
		var got int64
		for {
			m, err := cs.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return 0, err
			}
			got += int64(len(m))
		}
		if got != size {
			return 0, fmt.Errorf("received %d of %d bytes", got, size)
		}
		return time.Since(t0), nil
	}
	var out []sim.TransferSample
	for _, size := range sizes {
		var times []time.Duration
		for r := range reps + 1 {
			d, err := pull(size)
			if err != nil {
				return nil, fmt.Errorf("transfer of %d bytes: %w", size, err)
			}
			if r > 0 {
				times = append(times, d)
			}
		}
		slices.Sort(times)
		out = append(out, sim.TransferSample{Bytes: size, Time: times[len(times)/2]})
	}
	return out, nil
}
