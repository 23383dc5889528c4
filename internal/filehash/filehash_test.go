package filehash

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

func write(t *testing.T, path string, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// settle lets the test's fresh files be remembered.
func settle(t *testing.T) {
	old := racyWindow
	racyWindow = -time.Minute // a change "a minute in the future" counts as settled
	t.Cleanup(func() { racyWindow = old })
}

func TestFileHashRemembered(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("no inode or change time: every start hashes")
	}
	settle(t)
	dir, memo := t.TempDir(), t.TempDir()
	model := filepath.Join(dir, "m.gguf")
	write(t, model, "weights one")
	want := Sum(sha256.Sum256([]byte("weights one")))

	r, err := Of(model, memo)
	if err != nil || r.Sum != want || r.Read != int64(len("weights one")) {
		t.Fatalf("first: %+v %v, want %s read in full", r, err, want)
	}
	r, err = Of(model, memo)
	if err != nil || r.Sum != want || r.Read != 0 {
		t.Fatalf("second: %+v %v, want %s from the memo", r, err, want)
	}

	// Same size, same mtime (set back, as cp -p or touch -d would): only the change time
	// tells, and it must.
	fi, _ := os.Stat(model)
	time.Sleep(20 * time.Millisecond) // past the change time's granularity
	write(t, model, "weights two")
	if err := os.Chtimes(model, fi.ModTime(), fi.ModTime()); err != nil {
		t.Fatal(err)
	}
	r, err = Of(model, memo)
	if want2 := Sum(sha256.Sum256([]byte("weights two"))); err != nil || r.Sum != want2 || r.Read == 0 {
		t.Fatalf("after a rewrite of the same size and mtime: %+v %v, want %s hashed again", r, err, want2)
	}

	// A replaced file (a new inode) is hashed again too.
	tmp := model + ".new"
	write(t, tmp, "weights one")
	if err := os.Rename(tmp, model); err != nil {
		t.Fatal(err)
	}
	if r, err = Of(model, memo); err != nil || r.Sum != want || r.Read == 0 {
		t.Fatalf("after a replacement: %+v %v", r, err)
	}

	// A damaged memo is hashed past, and rewritten.
	write(t, filepath.Join(memo, MemoFile), "{not json")
	if r, err = Of(model, memo); err != nil || r.Sum != want || r.Read == 0 {
		t.Fatalf("with a damaged memo: %+v %v", r, err)
	}
	if r, err = Of(model, memo); err != nil || r.Read != 0 {
		t.Fatalf("after rewriting the damaged memo: %+v %v", r, err)
	}
}

// TestFreshFileNotRemembered: a file changed just before it is read is hashed again at the
// next start, since a write within the timestamps' granularity would not change them.
func TestFreshFileNotRemembered(t *testing.T) {
	dir, memo := t.TempDir(), t.TempDir()
	model := filepath.Join(dir, "m.gguf")
	write(t, model, "fresh")
	for i := range 2 {
		if r, err := Of(model, memo); err != nil || r.Read == 0 {
			t.Fatalf("read %d: %+v %v, want the file hashed", i, r, err)
		}
	}
}

func TestDirectoryHash(t *testing.T) {
	settle(t)
	dir := t.TempDir()
	write(t, filepath.Join(dir, "config.json"), "{}")
	write(t, filepath.Join(dir, "model.safetensors"), "tensors")
	write(t, filepath.Join(dir, ".hidden"), "ignored")
	a, err := Of(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, ".hidden"), "still ignored")
	if b, err := Of(dir, ""); err != nil || b.Sum != a.Sum {
		t.Fatalf("a hidden file changed the hash: %v %v", b, err)
	}
	// The same bytes under other names are another model.
	if err := os.Rename(filepath.Join(dir, "config.json"), filepath.Join(dir, "config2.json")); err != nil {
		t.Fatal(err)
	}
	if b, err := Of(dir, ""); err != nil || b.Sum == a.Sum {
		t.Fatalf("renaming a file kept the hash: %v %v", b, err)
	}
}

func TestParse(t *testing.T) {
	s := Bytes([]byte("x"))
	if p, err := Parse(s.String()); err != nil || p != s {
		t.Fatalf("%v %v", p, err)
	}
	for _, bad := range []string{"", "zz", s.String()[:10]} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}
