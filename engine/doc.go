// Package engine turns model forward passes into generated tokens: requests,
// the sampler, stop rules, and the loop that schedules prefill and decode.
package engine
