package bench

import "time"

// Result is a finished run.
type Result struct {
	Date           time.Time
	BaseURL        string
	Model          string
	Endpoint       Endpoint
	Workload       string
	PromptFormat   PromptFormat
	Arrival        Arrival
	RequestRate    float64
	Burstiness     float64
	TraceSpeedup   float64
	MaxConcurrency int
	NumPrompts     int // requests planned
	SLO            SLO
	Percentiles    []float64

	Requests    []RequestResult // by session, then turn
	Summary     Summary
	Interrupted int // planned requests not measured because the run was cancelled
}
