package main

import (
	"fmt"

	"tandem/gguf"
	"tandem/hal"
	"tandem/model"
	"tandem/modelgen"
)

// loadModel opens path, or builds the demo model when path is empty.
func loadModel(path string, be hal.Backend) (*model.Model, error) {
	if path != "" {
		return model.Load(path, be)
	}
	data, err := modelgen.DemoGGUF()
	if err != nil {
		return nil, fmt.Errorf("demo model: %w", err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		return nil, fmt.Errorf("demo model: %w", err)
	}
	return model.FromGGUF(f, be)
}
