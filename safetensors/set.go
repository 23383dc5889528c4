package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// maxIndexSize bounds model.safetensors.index.json, which is read whole.
const maxIndexSize = 256 << 20

// Set is a model's weights: model.safetensors alone, or the shards named by
// model.safetensors.index.json. It is safe for concurrent reads.
type Set struct {
	// Metadata is the index's "metadata" object, each value as a string
	// (non-string JSON values such as total_size in their JSON text), or the
	// single file's "__metadata__".
	Metadata map[string]string
	Files    []*File // each file once, in shard name order

	byName map[string]setEntry
	names  []string
}

type setEntry struct {
	file *File
	idx  int
}

// OpenDir opens the weights in dir: model.safetensors.index.json when
// present, else model.safetensors. With an index, every shard it names must
// exist and hold every tensor the index places in it.
func OpenDir(dir string) (*Set, error) {
	indexPath := filepath.Join(dir, IndexName)
	js, err := readIndex(indexPath)
	if err == nil {
		return openIndexed(dir, indexPath, js)
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("safetensors: %w", err)
	}
	single := filepath.Join(dir, SingleName)
	if _, err := os.Stat(single); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("safetensors: %s holds neither %s nor %s: %w", dir, IndexName, SingleName, fs.ErrNotExist)
	}
	f, err := Open(single)
	if err != nil {
		return nil, err
	}
	s := &Set{Metadata: f.Metadata, Files: []*File{f}, byName: make(map[string]setEntry, len(f.Tensors))}
	for i := range f.Tensors {
		s.byName[f.Tensors[i].Name] = setEntry{f, i}
		s.names = append(s.names, f.Tensors[i].Name)
	}
	slices.Sort(s.names)
	return s, nil
}

func readIndex(path string) ([]byte, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > maxIndexSize {
		return nil, fmt.Errorf("%s: %d bytes is too large for an index: %w", path, st.Size(), ErrFormat)
	}
	return os.ReadFile(path)
}

func openIndexed(dir, indexPath string, js []byte) (_ *Set, err error) {
	var idx struct {
		Metadata  map[string]json.RawMessage `json:"metadata"`
		WeightMap map[string]string          `json:"weight_map"`
	}
	if err := json.Unmarshal(js, &idx); err != nil {
		return nil, fmt.Errorf("safetensors: %s: %w", indexPath, formatErr("%v", err))
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("safetensors: %s: %w", indexPath, formatErr("no weight_map"))
	}
	s := &Set{byName: make(map[string]setEntry, len(idx.WeightMap))}
	if idx.Metadata != nil {
		s.Metadata = make(map[string]string, len(idx.Metadata))
		for k, v := range idx.Metadata {
			var str string
			if json.Unmarshal(v, &str) == nil {
				s.Metadata[k] = str
			} else {
				s.Metadata[k] = string(v)
			}
		}
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()

	// Group the tensors by shard, checking each shard name stays in dir.
	shards := make(map[string][]string)
	for name, shard := range idx.WeightMap {
		if !plainFileName(shard) {
			return nil, fmt.Errorf("safetensors: %s: %w", indexPath, formatErr("tensor %q: shard %q is not a file name in the same directory", name, shard))
		}
		shards[shard] = append(shards[shard], name)
	}
	for _, shard := range slices.Sorted(maps.Keys(shards)) {
		path := filepath.Join(dir, shard)
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("safetensors: %s names shard %s: %w", indexPath, shard, err)
		}
		f, err := Open(path)
		if err != nil {
			return nil, err
		}
		s.Files = append(s.Files, f)
		names := shards[shard]
		slices.Sort(names)
		for _, name := range names {
			i, ok := f.index(name)
			if !ok {
				return nil, fmt.Errorf("safetensors: %s: %w", indexPath, formatErr("tensor %q: weight_map places it in %s, which does not hold it", name, shard))
			}
			s.byName[name] = setEntry{f, i}
		}
		s.names = append(s.names, names...)
	}
	slices.Sort(s.names)
	return s, nil
}

// plainFileName reports whether name is a file name without any directory
// part, so an index cannot point outside its directory.
func plainFileName(name string) bool {
	return name != "" && name != "." && name != ".." &&
		!strings.ContainsAny(name, `/\:`) && filepath.Base(name) == name && filepath.IsLocal(name)
}

// Tensor returns a tensor's description and bytes (a read-only slice of the
// mapped shard, valid until Close).
func (s *Set) Tensor(name string) (*TensorInfo, []byte, bool) {
	e, ok := s.byName[name]
	if !ok || e.idx >= len(e.file.Tensors) {
		return nil, nil, false
	}
	t := &e.file.Tensors[e.idx]
	return t, e.file.TensorData(t), true
}

// Names lists the tensors, sorted.
func (s *Set) Names() []string { return slices.Clone(s.names) }

// Close closes every file, returning the first error.
func (s *Set) Close() error {
	var first error
	for _, f := range s.Files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	s.Files = nil
	s.byName = nil
	s.names = nil
	return first
}
