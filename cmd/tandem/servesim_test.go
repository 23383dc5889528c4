package main

import (
	"flag"
	"io"
	"testing"
	"time"

	"tandem/sim"
)

// The workers of a sim server time KV pulls with the loaded timing model; a CPU server's
// move real bytes and model nothing.
func TestServeTransferTime(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want time.Duration // of 1 MiB; -1: no model
	}{
		{[]string{"--backend", "cpu"}, -1},
		{[]string{"--backend", "sim"}, sim.GPUTiming().Transfer(1 << 20)},
		{[]string{"--backend", "sim", "--sim-profile", "cpu"}, sim.CPUTiming().Transfer(1 << 20)},
	} {
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		bk := addBackendFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if _, err := bk.check(nil, "", 0); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		tm := bk.simTiming()
		switch {
		case tc.want < 0 && tm != nil:
			t.Errorf("%v: a modelled transfer time, want none", tc.args)
		case tc.want >= 0 && tm == nil:
			t.Errorf("%v: no modelled transfer time", tc.args)
		case tc.want >= 0 && tm.Transfer(1<<20) != tc.want:
			t.Errorf("%v: 1 MiB takes %v, want %v", tc.args, tm.Transfer(1<<20), tc.want)
		}
	}
}
