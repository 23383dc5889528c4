// Package bench describes serving workloads (synthetic, shared-prefix, multi-turn, ShareGPT,
// Mooncake traces), their arrivals, and the serving metrics vLLM defines (TTFT, TPOT, ITL, E2E,
// throughput, goodput) with their reports; package loadgen sends them to a server.
package bench
