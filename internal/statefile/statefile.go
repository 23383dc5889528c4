// Package statefile writes the files of a state directory (a cluster CA, a join token, a
// node identity, remembered model cards) so that a crash at any moment leaves each file
// either as it was or complete, never truncated or half written.
package statefile

import (
	"io/fs"
	"os"
	"path/filepath"
)

// Write replaces path by data with permissions perm, atomically: data goes to a temporary
// file in the same directory, is synced, and is renamed over path; the directory is then
// synced, so that the rename itself survives a power loss, and files written one after
// another by Write land on disk in that order. Temporary files left behind by a writer of
// path killed before its rename are removed first.
func Write(path string, data []byte, perm fs.FileMode) error {
	return WriteWith(path, perm, func(f *os.File) error {
		_, err := f.Write(data)
		return err
	})
}

// WriteWith is Write for a file too large to hold in memory: write fills the temporary
// file (it must not close it), and path is replaced only if it returns nil. Otherwise
// the temporary file is removed and path is left as it was.
func WriteWith(path string, perm fs.FileMode, write func(f *os.File) error) error {
	dir, base := filepath.Dir(path), filepath.Base(path)
	pattern := "." + base + ".tmp*"
	if stale, err := filepath.Glob(filepath.Join(dir, pattern)); err == nil {
		for _, s := range stale {
			os.Remove(s)
		}
	}
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename there is nothing to remove
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return SyncDir(dir)
}

// Remove removes path if it exists and syncs its directory, so that the removal is on disk
// before whatever the caller writes next.
func Remove(path string) error {
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir makes the directory's entries (files created, renamed or removed in it) durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return &fs.PathError{Op: "sync", Path: dir, Err: err}
	}
	return nil
}
