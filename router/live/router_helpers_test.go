package live

import (
	"io"
	"log/slog"
	"testing"

	"tandem/orpc"
)

// newTestRouter is New(cfg) with a fresh cluster identity and, unless cfg has one, a
// logger that discards.
func newTestRouter(t testing.TB, cfg Config) *Router {
	t.Helper()
	ca, err := orpc.NewCA("test")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Identity, err = ca.NewIdentity("tandem-router", []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
