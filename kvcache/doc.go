// Package kvcache keeps the books of the engine's paged KV memory: block ids, reference counts,
// per-sequence block tables, the hash-addressed prefix cache with LRU eviction, and KV events.
package kvcache
