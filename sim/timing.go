package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"time"

	"tandem/sched"
)

// Timing is a worker's compute-time model, in milliseconds. A step that
// computes prompt tokens costs
//
//	prefill = PrefillBase + PrefillPerToken·N + PrefillPerToken2·Σ nᵢ·ctxᵢ
//
// where N is the step's new prompt tokens, nᵢ of them for sequence i whose
// context after the step is ctxᵢ tokens (for one uncached prompt of N tokens
// the last term is PrefillPerToken2·N²). A step that decodes B sequences costs
//
//	decode = DecodeBase + DecodePerSeq·B + DecodePerKVToken·K
//
// where K is the KV tokens the step's attention reads (each sequence's length
// including the token fed). A mixed step costs the sum of both. Moving KV
// blocks between workers (disaggregated prefill, migration) costs
//
//	transfer = TransferBase + TransferPerMiB·bytes/2²⁰
//
// `tandem profile` fits these parameters from a real engine; `tandem simulate
// --timing` and `tandem serve --backend sim --sim-profile` load them.
type Timing struct {
	PrefillBase      float64 `json:"prefill_base_ms"`
	PrefillPerToken  float64 `json:"prefill_per_token_ms"`
	PrefillPerToken2 float64 `json:"prefill_per_token2_ms"`
	DecodeBase       float64 `json:"decode_base_ms"`
	DecodePerSeq     float64 `json:"decode_per_seq_ms"`
	DecodePerKVToken float64 `json:"decode_per_kv_token_ms"`
	TransferBase     float64 `json:"transfer_base_ms"`
	TransferPerMiB   float64 `json:"transfer_per_mib_ms"`
}

// A StepShape is what one forward step computes, in the timing model's terms. It is
// package sched's, whose ITL target reads a Timing (a sched.CostModel) too.
type StepShape = sched.StepShape

// Step is the modelled time of a step of shape s.
func (t Timing) Step(s StepShape) time.Duration {
	ms := 0.0
	if s.PrefillTokens > 0 {
		ms += t.PrefillBase + t.PrefillPerToken*float64(s.PrefillTokens) + t.PrefillPerToken2*s.PrefillQuad
	}
	if s.DecodeSeqs > 0 {
		ms += t.DecodeBase + t.DecodePerSeq*float64(s.DecodeSeqs) + t.DecodePerKVToken*float64(s.KVTokens)
	}
	return msDur(ms)
}

// Transfer is the modelled time of moving n bytes of KV between workers.
func (t Timing) Transfer(n int64) time.Duration {
	return msDur(t.TransferBase + t.TransferPerMiB*float64(n)/(1<<20))
}

// GPUTiming is the default: roughly an 8B model in bf16 on one H100-class GPU
// (prefill ≈ 16k tokens/s, a decode step ≈ 6 ms of weight reads plus ≈ 44 ns
// per KV token of a 128 KiB/token cache at 3 TB/s); KV moves at ≈ 25 GB/s
// (RDMA or NVLink class) after 0.1 ms of set-up. Prefill's attention adds
// 1e-6 ms per unit of Σ nᵢ·ctxᵢ: a (query, key) pair costs 2·2·4096 FLOPs per
// layer over 32 layers, half the pairs of n·ctx are causal, at the ≈ 270
// TFLOP/s the linear term implies (16 GFLOPs a token in 0.06 ms): +16 % on a
// 12k-token prompt, +30 % at 32k.
func GPUTiming() Timing {
	return Timing{
		PrefillBase: 5, PrefillPerToken: 0.06, PrefillPerToken2: 1e-6,
		DecodeBase: 6, DecodePerSeq: 0.05, DecodePerKVToken: 0.00005,
		TransferBase: 0.1, TransferPerMiB: 0.04,
	}
}

// CPUTiming is roughly a 0.5B model on 2 CPU cores: a decode step ≈ 40 ms +
// 1 ms per sequence, prefill ≈ 15 ms per token; KV moves over loopback QUIC
// at ≈ 330 MiB/s after 1 ms.
func CPUTiming() Timing {
	return Timing{
		PrefillBase: 20, PrefillPerToken: 15,
		DecodeBase: 40, DecodePerSeq: 1, DecodePerKVToken: 0.0005,
		TransferBase: 1, TransferPerMiB: 3,
	}
}

// ReadTiming reads a Timing from JSON; absent fields keep the GPU defaults.
func ReadTiming(r io.Reader) (Timing, error) {
	t := GPUTiming()
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return Timing{}, fmt.Errorf("sim: timing file: %v", err)
	}
	return t, t.validate()
}

func (t Timing) validate() error {
	for _, v := range []float64{t.PrefillBase, t.PrefillPerToken, t.PrefillPerToken2, t.DecodeBase, t.DecodePerSeq, t.DecodePerKVToken, t.TransferBase, t.TransferPerMiB} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("sim: timing parameters must be finite and ≥ 0: %+v", t)
		}
	}
	return nil
}

// Prefill is the time of a step computing newTokens prompt tokens whose
// Σ nᵢ·ctxᵢ is quad (see Timing).
func (t Timing) Prefill(newTokens int, quad float64) time.Duration {
	return msDur(t.PrefillBase + t.PrefillPerToken*float64(newTokens) + t.PrefillPerToken2*quad)
}

// Decode is the time of a step decoding batch sequences that read kvTokens KV
// tokens.
func (t Timing) Decode(batch, kvTokens int) time.Duration {
	return msDur(t.DecodeBase + t.DecodePerSeq*float64(batch) + t.DecodePerKVToken*float64(kvTokens))
}

func msDur(ms float64) time.Duration {
	return time.Duration(math.Round(ms * float64(time.Millisecond)))
}
