// Package bench load-tests OpenAI-compatible servers with synthetic and replayed workloads
// and reports serving metrics (TTFT, TPOT, ITL, E2E, throughput, goodput) as vLLM defines them.
package bench
