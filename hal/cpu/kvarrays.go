package cpu

// KVArrays returns an F32 store's per-layer key and value arrays (block-major; within a
// block, keys are [kv head][dim][slot] and values [kv head][slot][dim]); nil for an F16
// store.
func (s *kvStore) KVArrays() (k, v [][]float32) { return s.k, s.v }

// KVBytes returns the store's per-layer key and value arrays as bytes, whatever the element
// type (Layout().DType; little-endian elements, arranged as KVArrays says). Package engine
// copies whole blocks through them to move KV between engines (disaggregated prefill and
// decode).
func (s *kvStore) KVBytes() (k, v [][]byte) { return s.kb, s.vb }
