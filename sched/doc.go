// Package sched is the continuous-batching policy that the engine runs on the wall clock and the
// simulator on virtual time: admission, chunked prefill, KV reservation, preemption; pure, no I/O.
package sched
