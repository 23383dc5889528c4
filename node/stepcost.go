package node

import (
	"context"
	"fmt"
	"time"

	"tandem/engine"
	"tandem/engine/simstep"
	"tandem/sim"
)

// measureStepCost times the model's forward pass on a few step shapes (simstep.QuickPlan,
// on a KV store of their size, freed after) and fits the step cost the ITL target starts
// from. When the shapes the limits allow are too few to fit, it starts from the built-in
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
	samples, err := simstep.Profile(ctx, f, m.Config.VocabSize, cfg.BlockSize, plan, nil, nil)
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
