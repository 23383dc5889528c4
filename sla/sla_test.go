package sla

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want Targets
		err  string
	}{
		{args: nil, want: Default},
		{args: []string{"--sla-ttft", "2s", "--sla-itl", "100ms"}, want: Targets{TTFT: 2 * time.Second, ITL: 100 * time.Millisecond}},
		{args: []string{"--sla-ttft", "0s"}, err: "--sla-ttft 0s: want a positive duration"},
		{args: []string{"--sla-itl", "-1ms"}, err: "--sla-itl -1ms: want a positive duration"},
	} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		got := AddFlags(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		err := got.Check()
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.err)
		case tc.err == "" && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case tc.err == "" && *got != tc.want:
			t.Errorf("%v: %+v, want %+v", tc.args, *got, tc.want)
		}
	}
}
