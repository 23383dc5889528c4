package cpu

// KVBytes returns the store's per-layer key and value arrays as bytes, whatever the element
// type (Layout().DType; little-endian elements, block-major; within a block, keys are
// [kv head][dim][slot] and values [kv head][slot][dim]). Package engine copies whole blocks
// through them to move KV between engines (disaggregated prefill and decode).
func (s *kvStore) KVBytes() (k, v [][]byte) { return s.kb, s.vb }
