package orpc

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// copyFiles copies the named files of src into a new directory.
func copyFiles(t *testing.T, src string, names ...string) string {
	t.Helper()
	dst := t.TempDir()
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(src, n))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, n), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// A router's state directory as a start killed at any point leaves it: a CA key without
// its certificate is an unfinished first start, replaced loudly (the key set aside); a
// certificate without its key is an error that names both files; temporary files of an
// interrupted write are ignored.
func TestLoadOrCreateCAPartial(t *testing.T) {
	full := t.TempDir()
	ca, created, err := LoadOrCreateCA(full, quietLogger())
	if err != nil || !created {
		t.Fatalf("first start: created %v, %v", created, err)
	}
	if err := os.WriteFile(filepath.Join(full, "."+CACertFile+".tmp123"), []byte("half a cert"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		files   []string
		created bool   // a new CA
		same    bool   // the CA of full
		logged  string // in the log
		err     string // in the error
	}{
		{name: "empty", created: true},
		{name: "complete", files: []string{CACertFile, CAKeyFile, "." + CACertFile + ".tmp123"}, same: true},
		{name: "key without certificate", files: []string{CAKeyFile, "." + CACertFile + ".tmp123"}, created: true, logged: "interrupted"},
		{name: "certificate without key", files: []string{CACertFile}, err: "ca.key does not"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyFiles(t, full, tc.files...)
			var logs strings.Builder
			got, created, err := LoadOrCreateCA(dir, slog.New(slog.NewTextHandler(&logs, nil)))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), filepath.Join(dir, CACertFile)) {
					t.Fatalf("error %v, want one naming %s and saying %q", err, filepath.Join(dir, CACertFile), tc.err)
				}
				t.Logf("error: %v", err)
				return
			}
			if err != nil || created != tc.created {
				t.Fatalf("created %v, %v; want created %v", created, err, tc.created)
			}
			if tc.same != got.Cert.Equal(ca.Cert) {
				t.Errorf("the CA of the complete directory: %v, want %v", got.Cert.Equal(ca.Cert), tc.same)
			}
			if !strings.Contains(logs.String(), tc.logged) || (tc.logged == "" && logs.Len() > 0) {
				t.Errorf("log %q, want %q", logs.String(), tc.logged)
			}
			if tc.logged != "" {
				if _, err := os.Stat(filepath.Join(dir, CAKeyFile+".orphaned")); err != nil {
					t.Errorf("the unfinished CA's key was not set aside: %v", err)
				}
			}
			// What is on disk now loads as that CA.
			again, created, err := LoadOrCreateCA(dir, quietLogger())
			if err != nil || created || !again.Cert.Equal(got.Cert) {
				t.Errorf("next start: created %v, %v, same CA %v", created, err, err == nil && again.Cert.Equal(got.Cert))
			}
		})
	}
}

// An engine's identity as a join interrupted at any point, a damaged file, time or a
// replaced CA leave it. node.crt is the commit point: without it there is no identity;
// every other failure names the file. Without a token JoinOrLoad says why it cannot go on.
func TestLoadIdentityPartial(t *testing.T) {
	ca, err := NewCA("test cluster")
	if err != nil {
		t.Fatal(err)
	}
	full := t.TempDir()
	id, err := ca.NewIdentity("worker-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := id.Save(full); err != nil {
		t.Fatal(err)
	}
	// An expired identity, and one whose ca.crt is another CA's.
	expired := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	cert, err := ca.Issue("worker-1", nil, key.Public(), time.Nanosecond)
	if err != nil {
		t.Fatal(err)
	}
	if err := newIdentity(cert, key, ca.Cert).Save(expired); err != nil {
		t.Fatal(err)
	}
	other, _ := NewCA("another cluster")
	otherCA := copyFiles(t, full, NodeCertFile, NodeKeyFile)
	if err := os.WriteFile(filepath.Join(otherCA, CACertFile), certToPEM(other.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	corrupt := copyFiles(t, full, NodeKeyFile, CACertFile)
	if err := os.WriteFile(filepath.Join(corrupt, NodeCertFile), []byte("-----BEGIN CERTIFICATE-----\nAAAA\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	otherKey := copyFiles(t, full, NodeCertFile, CACertFile)
	k2, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	kp, _ := keyToPEM(k2)
	if err := os.WriteFile(filepath.Join(otherKey, NodeKeyFile), kp, 0o600); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name  string
		dir   string
		none  bool   // ErrNoIdentity
		err   string // the file the error names ("" for none)
		wrong string // the name asked for, if not worker-1
	}{
		{name: "complete", dir: full},
		{name: "empty", dir: t.TempDir(), none: true, err: NodeCertFile},
		{name: "key and CA, no certificate", dir: copyFiles(t, full, NodeKeyFile, CACertFile), none: true, err: NodeCertFile},
		{name: "certificate without key", dir: copyFiles(t, full, NodeCertFile, CACertFile), err: NodeKeyFile},
		{name: "certificate without CA", dir: copyFiles(t, full, NodeCertFile, NodeKeyFile), err: CACertFile},
		{name: "corrupt certificate", dir: corrupt, err: NodeCertFile},
		{name: "another key", dir: otherKey, err: NodeKeyFile},
		{name: "expired", dir: expired, err: NodeCertFile},
		{name: "other CA", dir: otherCA, err: NodeCertFile},
		{name: "another node's", dir: full, wrong: "worker-2", err: NodeCertFile},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := "worker-1"
			if tc.wrong != "" {
				name = tc.wrong
			}
			if tc.wrong == "" {
				got, err := LoadIdentity(tc.dir)
				if errors.Is(err, ErrNoIdentity) != tc.none || (tc.none && !errors.Is(err, fs.ErrNotExist)) {
					t.Errorf("LoadIdentity: %v; want ErrNoIdentity %v", err, tc.none)
				}
				if (err == nil) != (tc.err == "") {
					t.Fatalf("LoadIdentity: %v", err)
				}
				if err == nil && !got.Cert.Equal(id.Cert) {
					t.Error("loaded another certificate")
				}
			}
			got, joined, err := JoinOrLoad(testCtx(t), tc.dir, "127.0.0.1:1", Token{}, name, nil)
			if tc.err == "" {
				if err != nil || joined || !got.Cert.Equal(id.Cert) {
					t.Fatalf("JoinOrLoad without a token: joined %v, %v", joined, err)
				}
				return
			}
			t.Logf("JoinOrLoad without a token: %v", err)
			if err == nil || !strings.Contains(err.Error(), filepath.Join(tc.dir, tc.err)) || !strings.Contains(err.Error(), "without a join token") {
				t.Errorf("JoinOrLoad without a token: %v; want an error naming %s", err, filepath.Join(tc.dir, tc.err))
			}
		})
	}
}

// Saving an identity over another leaves the new one, consistent, and no temporary files.
func TestIdentitySaveReplaces(t *testing.T) {
	ca, _ := NewCA("test cluster")
	dir := t.TempDir()
	for _, name := range []string{"a", "b"} {
		id, err := ca.NewIdentity(name, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := id.Save(dir); err != nil {
			t.Fatal(err)
		}
		got, err := LoadIdentity(dir)
		if err != nil || got.Name != name {
			t.Fatalf("after saving %s: %v %v", name, got, err)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 3 {
		t.Errorf("%d files in the state directory, want node.crt, node.key, ca.crt", len(ents))
	}
}
