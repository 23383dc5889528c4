package main

import (
	"flag"
	"fmt"

	"tandem/hal"
)

// defaultKVType is --kv-type's default. F32, not llama.cpp's F16: with an F16 cache the
// fixture models no longer meet the golden tests' tolerances against llama.cpp's own F32-KV
// references (docs/architecture.md, "KV memory").
const defaultKVType = "f32"

// kvTypeFlag is --kv-type, the KV cache's element type.
type kvTypeFlag struct{ s *string }

func addKVTypeFlag(fs *flag.FlagSet) kvTypeFlag {
	return kvTypeFlag{fs.String("kv-type", defaultKVType, "KV cache element type: f32, or f16 (half the memory: twice the tokens in a budget; values rounded to nearest even)")}
}

// parse checks the flag's value (before anything is loaded).
func (f kvTypeFlag) parse() (hal.DType, error) {
	switch *f.s {
	case "f32":
		return hal.F32, nil
	case "f16":
		return hal.F16, nil
	}
	return 0, fmt.Errorf("--kv-type %q: want f16 or f32", *f.s)
}
