// Package router is the functional core of tandem-router: the global KV block index, worker load,
// the cost function, routing modes, session affinity and backpressure, as pure deterministic code.
package router
