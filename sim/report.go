package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// WriteTable writes tandem bench's table, then the cluster's cache and load
// figures and one line per worker.
func (r *Result) WriteTable(w io.Writer) error {
	if err := r.Bench.WriteTable(w); err != nil {
		return err
	}
	var b strings.Builder
	row := func(label string, v any) { fmt.Fprintf(&b, "%-40s %v\n", label, v) }
	row("Routing mode:", r.Routing)
	row("Simulated workers:", len(r.Workers))
	row("Prefix cache hit rate:", fmt.Sprintf("%.4f", r.HitRate))
	row("Hit rate, one unbounded cache:", fmt.Sprintf("%.4f", r.IdealHitRate))
	row("Imbalance, tokens (max/mean):", fmt.Sprintf("%.3f", r.TokenImbalance))
	row("Imbalance, tokens (CV):", fmt.Sprintf("%.3f", r.TokenCV))
	row("Imbalance, active requests (max/mean):", fmt.Sprintf("%.3f", r.ActiveImbalance))
	row("Requests queued in the router:", r.RouterQueued)
	if c := r.Config; c.ITLTarget > 0 || c.ITLDecodes > 0 {
		over := 0
		for _, ws := range r.Workers {
			over += ws.OverTarget
		}
		target := c.ITLTarget.String()
		if c.ITLDecodes > 0 {
			target = fmt.Sprintf("%gx the decodes", c.ITLDecodes)
		}
		row("Steps over the ITL target:", fmt.Sprintf("%d (target %s)", over, target))
	}
	roles := r.Config.disaggregated() || r.Plan != nil
	if r.Config.disaggregated() {
		row("Prefill / decode workers at the start:", fmt.Sprintf("%d / %d", r.Config.PrefillWorkers, r.Config.DecodeWorkers))
		row("Remote prefills:", r.RemotePrefills)
		row("KV moved to decode workers (GiB):", fmt.Sprintf("%.2f", float64(r.Transferred)/(1<<30)))
	}
	if roles {
		row("Worker-hours (both/prefill/decode):", fmt.Sprintf("%.3f / %.3f / %.3f", r.WorkerSeconds[0]/3600, r.WorkerSeconds[1]/3600, r.WorkerSeconds[2]/3600))
	}
	if t := r.tierTotals(); t != (TierStats{}) {
		bs := r.Config.BlockSize
		row("Tokens loaded from host memory:", t.Onboarded[1]*bs)
		row("Tokens loaded from disk:", t.Onboarded[2]*bs)
		row("Tokens loaded from the shared dir:", t.Onboarded[3]*bs)
		row("Tokens pulled from peers:", t.Pulled*bs)
	}
	b.WriteString("worker  requests  prefill_tok  decode_tok  cached_tok  preempt   busy_s  mean_active")
	if roles {
		b.WriteString("  role     alive_s")
	}
	b.WriteString("\n")
	for i, ws := range r.Workers {
		fmt.Fprintf(&b, "%6d  %8d  %11d  %10d  %10d  %7d  %7.1f  %11.2f", i, ws.Requests, ws.PrefillTokens,
			ws.DecodeTokens, ws.CachedTokens, ws.Preemptions, ws.Busy.Seconds(), ws.MeanActive)
		if roles {
			fmt.Fprintf(&b, "  %-7s  %7.1f", ws.Role, ws.Alive.Seconds())
		}
		b.WriteString("\n")
	}
	b.WriteString(strings.Repeat("=", 50) + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// JSON is tandem bench's JSON report (per-request arrays included) with the
// simulation's figures added.
func (r *Result) JSON() map[string]any {
	m := r.Bench.JSON()
	m["backend"] = "sim"
	m["routing"] = string(r.Routing)
	m["num_workers"] = len(r.Workers)
	m["prefix_cache_hit_rate"] = r.HitRate
	m["ideal_prefix_cache_hit_rate"] = r.IdealHitRate
	m["total_prompt_tokens_admitted"] = r.PromptTokens
	m["imbalance_tokens_max_over_mean"] = r.TokenImbalance
	m["imbalance_tokens_cv"] = r.TokenCV
	m["imbalance_active_max_over_mean"] = r.ActiveImbalance
	m["router_queued"] = r.RouterQueued
	m["sim_events"] = r.Events
	m["worker_seconds"] = map[string]float64{"both": r.WorkerSeconds[0], "prefill": r.WorkerSeconds[1], "decode": r.WorkerSeconds[2]}
	if c := r.Config; c.disaggregated() {
		m["prefill_workers"], m["decode_workers"] = c.PrefillWorkers, c.DecodeWorkers
		m["remote_prefills"], m["kv_transferred_bytes"] = r.RemotePrefills, r.Transferred
		m["disagg_min_tokens"], m["kv_bytes_per_token"] = c.Disagg.MinRemoteTokens, c.KVBytesPerToken
	}
	if t := r.tierTotals(); t != (TierStats{}) {
		bs := r.Config.BlockSize
		m["tier_loaded_tokens"] = map[string]int{"host": t.Onboarded[1] * bs, "disk": t.Onboarded[2] * bs, "remote": t.Onboarded[3] * bs}
		m["peer_pulled_tokens"] = t.Pulled * bs
	}
	c := r.Config
	m["sim_config"] = map[string]any{
		"timing": c.Timing, "block_size": c.BlockSize, "kv_blocks": c.KVBlocks,
		"max_num_batched_tokens": c.TokenBudget, "max_num_seqs": c.MaxSeqs, "itl_target_ms": c.ITLTarget.Seconds() * 1000, "itl_target_decodes": c.ITLDecodes,
		"report_interval_ms": c.ReportInterval.Seconds() * 1000, "seed": c.Seed,
		"report_delay_ms": c.ReportDelay.Seconds() * 1000, "event_delay_ms": c.EventDelay.Seconds() * 1000,
		"overlap_weight": c.Router.OverlapWeight, "temperature": c.Router.Temperature,
		"tiers": c.Tiers, "peer_pulls": c.Router.PeerPulls,
	}
	ws := make([]map[string]any, len(r.Workers))
	for i, w := range r.Workers {
		ws[i] = map[string]any{
			"requests": w.Requests, "prefill_tokens": w.PrefillTokens, "decode_tokens": w.DecodeTokens,
			"cached_tokens": w.CachedTokens, "preemptions": w.Preemptions, "steps": w.Steps, "steps_over_itl_target": w.OverTarget,
			"busy_s": w.Busy.Seconds(), "mean_active": w.MeanActive, "role": w.Role, "alive_s": w.Alive.Seconds(),
		}
	}
	m["workers"] = ws
	return m
}

// WriteJSON writes JSON() on one line, keys sorted.
func (r *Result) WriteJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(r.JSON())
}

// tierTotals sums the workers' tier figures.
func (r *Result) tierTotals() TierStats {
	var t TierStats
	for _, w := range r.Workers {
		for i := range t.Onboarded {
			t.Onboarded[i] += w.Tiers.Onboarded[i]
		}
		t.Pulled += w.Tiers.Pulled
	}
	return t
}
