package statefile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// LockFile is the file in a state directory that the process using the directory holds
// locked.
const LockFile = ".lock"

// ErrLocked is wrapped by Lock's error when another process holds the directory.
var ErrLocked = errors.New("state directory in use by another process")

// Lock claims dir (created, 0700, if needed) for this process until release is called or
// the process ends: two live processes never share a state directory (they would overwrite
// each other's identity and claim one node name). The holder's pid is kept in the lock
// file for the error another process gets. Where the system has no advisory locks, Lock
// claims nothing and returns a no-op release.
func Lock(dir string) (release func(), err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	held, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	if !held {
		b, _ := os.ReadFile(path)
		f.Close()
		holder := "another process"
		if pid := strings.TrimSpace(string(b)); pid != "" {
			if _, err := strconv.Atoi(pid); err == nil {
				holder = "process " + pid
			}
		}
		return nil, fmt.Errorf("%w: %s is held by %s; give each process its own --state-dir", ErrLocked, dir, holder)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() {
		unlock(f)
		f.Close()
	}, nil
}

// DefaultDir is the default state directory of the process named name:
// $XDG_STATE_HOME/tandem/name, else ~/.local/state/tandem/name, as the XDG base directory
// specification places state that should outlive a restart.
func DefaultDir(name string) (string, error) {
	if base := os.Getenv("XDG_STATE_HOME"); filepath.IsAbs(base) {
		return filepath.Join(base, "tandem", name), nil
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		return "", fmt.Errorf("no home directory for the default state directory (set --state-dir or XDG_STATE_HOME): %v", err)
	}
	return filepath.Join(home, ".local", "state", "tandem", name), nil
}
