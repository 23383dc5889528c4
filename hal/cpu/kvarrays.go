package cpu

// KVArrays returns the store's per-layer key and value arrays (block-major; within a block,
// keys are [kv head][dim][slot] and values [kv head][slot][dim]). Package engine copies whole
// blocks through them to move KV between engines (disaggregated prefill and decode).
func (s *kvStore) KVArrays() (k, v [][]float32) { return s.k, s.v }
