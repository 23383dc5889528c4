package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"tandem/sched"
	"tandem/sim"
)

// defaultITLTarget is tandem serve's --itl-target: four times the machine's decode step of
// one sequence, as the engine's corrected step cost predicts it at each step
// (docs/architecture.md, "The engine's scheduler", gives the measurements).
const defaultITLTarget = "4x"

// itlTarget is an --itl-target value: a duration, a multiple of the step cost's decode
// step of one sequence ("4x"), or none ("0").
type itlTarget struct {
	abs     time.Duration
	decodes float64
}

func parseITLTarget(s string) (itlTarget, error) {
	switch s {
	case "0", "none", "off":
		return itlTarget{}, nil
	}
	if k, ok := strings.CutSuffix(s, "x"); ok {
		f, err := strconv.ParseFloat(k, 64)
		if err != nil || !(f >= 1) || f > 1000 {
			return itlTarget{}, fmt.Errorf("--itl-target %q: want a multiple of a decode step from 1x to 1000x, a duration, or 0", s)
		}
		return itlTarget{decodes: f}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return itlTarget{}, fmt.Errorf("--itl-target %q: want a duration (100ms), a multiple of a decode step (4x), or 0", s)
	}
	return itlTarget{abs: d}, nil
}

// resolve is the target for timing t: its multiple of t's decode step of one sequence,
// as the engine's scheduler takes it (sched.DecodeTarget); the simulator's timing does not
// change, so the target it gives is fixed.
func (x itlTarget) resolve(t sim.Timing) time.Duration {
	if x.decodes == 0 {
		return x.abs
	}
	return sched.DecodeTarget(t, x.decodes)
}
