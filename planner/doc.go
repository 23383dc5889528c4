// Package planner is the SLA planner's core: it predicts the next interval's load, sizes the
// prefill and decode pools (or one aggregated pool) to TTFT and ITL targets with a model of
// one worker's speed, and corrects the sizes from measured latency. It is pure: no I/O, no
// clock (the caller passes the time), no goroutines; the live router, the simulator and
// tandem plan run the same code (docs/planner.md).
package planner
