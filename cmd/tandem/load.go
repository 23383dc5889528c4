package main

import (
	"fmt"
	"log/slog"

	"tandem/gguf"
	"tandem/hal"
	"tandem/model"
	"tandem/modelgen"
)

// openModel starts the backend dev names (the CPU's with threads workers,
// 0 for all cores) and loads the model at path on it (the demo model when
// path is empty). close releases both.
func openModel(path string, dev deviceFlag, threads int, log *slog.Logger) (be hal.Backend, m *model.Model, close func(), err error) {
	if be, err = dev.open(threads, log); err != nil {
		return nil, nil, nil, err
	}
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
