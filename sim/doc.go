// Package sim replays request traces over simulated workers in virtual time: a timing model stands in
// for compute, while the real scheduler policy, kvcache.Pool prefix caching and router decisions run.
package sim
