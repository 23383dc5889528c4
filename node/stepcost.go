package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"tandem/engine"
	"tandem/engine/simstep"
	"tandem/sim"
)

// DefaultStepProfileBudget bounds the quick profile at start (Config.StepProfileBudget):
// a 0.5B model on 2 cores takes about 4 s, 10-15 s with other work on them, but a software
// Vulkan device (lavapipe) took a minute over the demo model, and a server must not take
// that long to start.
const DefaultStepProfileBudget = 15 * time.Second

// measureStepCost times the model's forward pass on a few step shapes (simstep.QuickPlan,
// on a KV store of their size, freed after) and fits the step cost the ITL target starts
// from. When the shapes the limits allow are too few to fit, or the profile takes longer
// than its budget, it starts from the built-in
// CPU profile instead, and says so (source "builtin", else "measured"): the engine's live
// correction then finds the scale.
func (n *Node) measureStepCost(ctx context.Context) (t sim.Timing, source string, err error) {
	cfg, m := n.cfg, n.cfg.Model
	maxBatch := cfg.MaxBatchTokens
	if maxBatch <= 0 {
		maxBatch = engine.DefaultMaxBatchTokens
	}
	plan := simstep.QuickPlan(m.Config.ContextLen, maxBatch, cfg.MaxSeqs)
	t0 := time.Now()
	f, err := engine.ModelForwarder(m, cfg.Backend, plan.Blocks(cfg.BlockSize), cfg.BlockSize)
	if err != nil {
		return sim.Timing{}, "", fmt.Errorf("node: measuring the step cost: %w", err)
	}
	budget := cmp.Or(cfg.StepProfileBudget, DefaultStepProfileBudget)
	pctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	samples, err := simstep.Profile(pctx, f, m.Config.VocabSize, cfg.BlockSize, plan, nil, nil)
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		n.log.Warn("the quick profile of the step cost took too long; starting from the built-in CPU profile, corrected live (give --step-profile to start from a measured one)",
			"budget", budget)
		return sim.CPUTiming(), "builtin", nil
	}
	if err != nil {
		return sim.Timing{}, "", fmt.Errorf("node: measuring the step cost: %w", err)
	}
	t, err = sim.Fit(samples, nil, sim.CPUTiming())
	if err != nil {
		n.log.Warn("cannot fit the step cost from a quick profile; starting from the built-in CPU profile, corrected live", "err", err)
		return sim.CPUTiming(), "builtin", nil
	}
	n.log.Info("measured the step cost for the ITL target", "took", time.Since(t0).Round(time.Millisecond),
		"prefill_ms", fmt.Sprintf("%.2f + %.3f/token + %.2g/token²", t.PrefillBase, t.PrefillPerToken, t.PrefillPerToken2),
		"decode_ms", fmt.Sprintf("%.2f + %.3f/seq + %.2g/KV token", t.DecodeBase, t.DecodePerSeq, t.DecodePerKVToken))
	return t, "measured", nil
}
