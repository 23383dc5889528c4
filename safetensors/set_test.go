package safetensors

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// shardedDir writes three shards of four F32 tensors each and returns the
// directory and every tensor's bytes.
func shardedDir(t *testing.T) (string, map[string][]byte) {
	t.Helper()
	dir := t.TempDir()
	datas := map[string][]byte{}
	var ws []*Writer
	for s := range 3 {
		w := NewWriter()
		w.SetMetadata("format", "pt")
		for i := range 4 {
			name := fmt.Sprintf("layers.%d.w%d", s, i)
			d := fill(4*(i+1), byte(10*s+i))
			datas[name] = d
			if err := w.Add(name, "F32", []int64{int64(i + 1)}, d); err != nil {
				t.Fatal(err)
			}
		}
		ws = append(ws, w)
	}
	if err := WriteSharded(dir, ws); err != nil {
		t.Fatal(err)
	}
	return dir, datas
}

func TestSetSharded(t *testing.T) {
	dir, datas := shardedDir(t)
	for i := 1; i <= 3; i++ {
		if _, err := os.Stat(filepath.Join(dir, fmt.Sprintf("model-%05d-of-00003.safetensors", i))); err != nil {
			t.Fatal(err)
		}
	}
	s, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	names := s.Names()
	if !slices.IsSorted(names) || len(names) != len(datas) {
		t.Errorf("Names = %v", names)
	}
	for _, name := range names {
		ti, d, ok := s.Tensor(name)
		if !ok || ti.Name != name || !bytes.Equal(d, datas[name]) {
			t.Errorf("%s: %v %v", name, ti, ok)
		}
	}
	if _, _, ok := s.Tensor("missing"); ok {
		t.Error("found a missing tensor")
	}
	if len(s.Files) != 3 || s.Metadata["total_size"] != "120" {
		t.Errorf("%d files, metadata %v", len(s.Files), s.Metadata)
	}
	if err := s.Close(); err != nil {
		t.Error(err)
	}
}

func TestSetSingle(t *testing.T) {
	dir := t.TempDir()
	w := NewWriter()
	w.SetMetadata("format", "pt")
	for _, n := range []string{"b", "a", "c"} {
		if err := w.Add(n, "BF16", []int64{2}, []byte(n+n+n+n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.WriteFile(filepath.Join(dir, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	s, err := OpenDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !slices.Equal(s.Names(), []string{"a", "b", "c"}) || s.Metadata["format"] != "pt" {
		t.Errorf("Names %v Metadata %v", s.Names(), s.Metadata)
	}
	if _, d, ok := s.Tensor("c"); !ok || string(d) != "cccc" {
		t.Errorf("c = %q %v", d, ok)
	}
}

func TestSetErrors(t *testing.T) {
	// Each case edits a fresh sharded directory.
	cases := []struct {
		name     string
		edit     func(t *testing.T, dir string)
		want     string
		isFormat bool
	}{
		{"empty dir", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, IndexName))
		}, "holds neither model.safetensors.index.json nor model.safetensors", false},
		{"missing shard", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, ShardName(2, 3)))
		}, "names shard model-00002-of-00003.safetensors", false},
		{"tensor not in its shard", func(t *testing.T, dir string) {
			editIndex(t, dir, `"layers.1.w0": "model-00002-of-00003.safetensors"`, `"layers.1.w0": "model-00001-of-00003.safetensors"`)
		}, `tensor "layers.1.w0": weight_map places it in model-00001-of-00003.safetensors, which does not hold it`, true},
		{"tensor missing everywhere", func(t *testing.T, dir string) {
			editIndex(t, dir, `"layers.1.w0":`, `"ghost": "model-00001-of-00003.safetensors", "layers.1.w0":`)
		}, `tensor "ghost"`, true},
		{"shard outside dir", func(t *testing.T, dir string) {
			editIndex(t, dir, `"model-00002-of-00003.safetensors"`, `"../model-00002-of-00003.safetensors"`)
		}, `is not a file name in the same directory`, true},
		{"absolute shard", func(t *testing.T, dir string) {
			editIndex(t, dir, `"model-00002-of-00003.safetensors"`, `"/etc/passwd"`)
		}, `is not a file name`, true},
		{"bad index json", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, IndexName), []byte(`{"weight_map": [`), 0o644)
		}, IndexName, true},
		{"no weight_map", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, IndexName), []byte(`{"metadata": {}}`), 0o644)
		}, "no weight_map", true},
		{"corrupt shard", func(t *testing.T, dir string) {
			p := filepath.Join(dir, ShardName(3, 3))
			b, _ := os.ReadFile(p)
			os.WriteFile(p, b[:len(b)-1], 0o644)
		}, ShardName(3, 3), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir, _ := shardedDir(t)
			if c.name == "empty dir" {
				for i := 1; i <= 3; i++ {
					os.Remove(filepath.Join(dir, ShardName(i, 3)))
				}
			}
			c.edit(t, dir)
			s, err := OpenDir(dir)
			if err == nil {
				s.Close()
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("%q does not contain %q", err, c.want)
			}
			if errors.Is(err, ErrFormat) != c.isFormat {
				t.Errorf("%v: errors.Is(ErrFormat) = %v", err, !c.isFormat)
			}
			if !c.isFormat && !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("%v: not fs.ErrNotExist", err)
			}
		})
	}
}

func editIndex(t *testing.T, dir, old, new string) {
	t.Helper()
	p := filepath.Join(dir, IndexName)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte(old)) {
		t.Fatalf("index lacks %s:\n%s", old, b)
	}
	if err := os.WriteFile(p, bytes.Replace(b, []byte(old), []byte(new), 1), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestWriteShardedErrors(t *testing.T) {
	if err := WriteSharded(t.TempDir(), nil); err == nil {
		t.Error("no shards accepted")
	}
	a, b := NewWriter(), NewWriter()
	a.Add("x", "U8", []int64{1}, []byte{1})
	b.Add("x", "U8", []int64{1}, []byte{2})
	if err := WriteSharded(t.TempDir(), []*Writer{a, b}); err == nil || !strings.Contains(err.Error(), `"x" in both`) {
		t.Errorf("duplicate across shards: %v", err)
	}
}
