// Package loadgen drives a bench.Workload against an OpenAI-compatible server over HTTP and
// measures it: arrivals, concurrency, streaming timelines, warm-ups and progress.
package loadgen
