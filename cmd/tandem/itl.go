package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// defaultITLTarget is tandem serve's --itl-target: a step that reads prompts takes at most
// 2.5 times what its decodes alone take, as the engine's corrected step cost predicts them
// (docs/architecture.md, "The engine's scheduler", gives the measurements).
const defaultITLTarget = "2.5x"

// itlTarget is an --itl-target value: a duration, a multiple of the step's decodes alone
// ("2.5x"), or none ("0").
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
			return itlTarget{}, fmt.Errorf("--itl-target %q: want a multiple of the decodes' time from 1x to 1000x, a duration, or 0", s)
		}
		return itlTarget{decodes: f}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return itlTarget{}, fmt.Errorf("--itl-target %q: want a duration (100ms), a multiple of the decodes' time (2.5x), or 0", s)
	}
	return itlTarget{abs: d}, nil
}
