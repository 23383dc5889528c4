// Package sla holds the latency targets a deployment promises: time to first token and
// inter-token latency. The dashboards draw them; the SLA planner will size replicas to them.
package sla

import (
	"flag"
	"fmt"
	"time"
)

// Targets are the latency objectives: a request's time to first token and the gap
// between two of its tokens should stay under them.
type Targets struct {
	TTFT time.Duration
	ITL  time.Duration
}

// Default are the targets used when no flag sets them: 500 ms to the first token and
// 50 ms between tokens (20 tokens/s per stream), a common interactive-chat objective.
var Default = Targets{TTFT: 500 * time.Millisecond, ITL: 50 * time.Millisecond}

// AddFlags defines --sla-ttft and --sla-itl on fs, starting from Default, and returns the
// targets they set once fs is parsed. Check them before use.
func AddFlags(fs *flag.FlagSet) *Targets {
	t := Default
	fs.DurationVar(&t.TTFT, "sla-ttft", t.TTFT, "time-to-first-token target, drawn on the dashboard's latency charts")
	fs.DurationVar(&t.ITL, "sla-itl", t.ITL, "inter-token-latency target, drawn on the dashboard's latency charts")
	return &t
}

// Check reports a target that is not positive, naming its flag.
func (t Targets) Check() error {
	if t.TTFT <= 0 {
		return fmt.Errorf("--sla-ttft %v: want a positive duration", t.TTFT)
	}
	if t.ITL <= 0 {
		return fmt.Errorf("--sla-itl %v: want a positive duration", t.ITL)
	}
	return nil
}
