package statefile

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestLockHelper is the other process of TestLockAcrossProcesses.
func TestLockHelper(t *testing.T) {
	dir := os.Getenv("STATEFILE_LOCK_DIR")
	if dir == "" {
		t.Skip("run by TestLockAcrossProcesses")
	}
	if _, err := Lock(dir); err != nil {
		os.Stdout.WriteString("refused (ErrLocked " + strconv.FormatBool(errors.Is(err, ErrLocked)) + "): " + err.Error() + "\n")
		return
	}
	os.Stdout.WriteString("locked\n")
}

// TestLockAcrossProcesses: while this process holds a directory, another process is
// refused with an error naming this pid; once released, it gets it.
func TestLockAcrossProcesses(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	release, err := Lock(dir)
	if err != nil {
		t.Fatal(err)
	}
	other := func() string {
		cmd := exec.Command(os.Args[0], "-test.run=^TestLockHelper$")
		cmd.Env = append(os.Environ(), "STATEFILE_LOCK_DIR="+dir)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("helper: %v", err)
		}
		return string(out)
	}
	if out := other(); !strings.Contains(out, "refused (ErrLocked true)") || !strings.Contains(out, "process "+strconv.Itoa(os.Getpid())) {
		t.Fatalf("a second process while held: %q", out)
	}
	release()
	if out := other(); !strings.Contains(out, "locked") {
		t.Fatalf("a second process after release: %q", out)
	}
	if _, err := Lock(dir); err != nil {
		t.Fatalf("relock after the other process ended: %v", err)
	}
}

func TestDefaultDir(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", "/srv/state")
	if d, _ := DefaultDir("serve-8081"); d != "/srv/state/tandem/serve-8081" {
		t.Errorf("with XDG_STATE_HOME: %s", d)
	}
	t.Setenv("XDG_STATE_HOME", "relative/ignored")
	t.Setenv("HOME", "/home/u")
	if d, _ := DefaultDir("router-8000"); d != "/home/u/.local/state/tandem/router-8000" {
		t.Errorf("without: %s", d)
	}
}
