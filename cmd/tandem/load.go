package main

import (
	"fmt"

	"tandem/gguf"
	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/model"
	"tandem/modelgen"
)

// openModel starts a CPU backend with threads workers (0: all cores) and
// loads the model at path on it (the demo model when path is empty). close
// releases both.
func openModel(path string, threads int) (be *cpu.Backend, m *model.Model, close func(), err error) {
	be = cpu.New(threads)
	m, err = loadModel(path, be)
	if err != nil {
		be.Close()
		return nil, nil, nil, err
	}
	return be, m, func() { m.Close(); be.Close() }, nil
}

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
