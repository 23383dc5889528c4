package connector

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"tandem/planner"
)

// The planner's view of the connector: a failed read of the replicas gives the last list
// read and is counted; a scale the server forbids is a refusal, one it fails at an error.
func TestForPlanner(t *testing.T) {
	var broken atomic.Bool
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case broken.Load() && r.Method == "GET":
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"kind":"Status","message":"etcd is down"}`)
		case r.Method == "GET" && strings.HasSuffix(r.URL.Path, "/tandempools"):
			io.WriteString(w, `{"items":[{"metadata":{"name":"c-both"}}]}`)
		case r.Method == "GET" && strings.HasSuffix(r.URL.Path, "/scale"):
			io.WriteString(w, `{"status":{"selector":"tandem.dev/pool=c-both"}}`)
		case r.Method == "GET" && strings.HasSuffix(r.URL.Path, "/pods"):
			io.WriteString(w, `{"items":[{"metadata":{"name":"c-both-1","creationTimestamp":"2026-12-01T00:00:00Z"}},`+
				`{"metadata":{"name":"c-both-2","creationTimestamp":"2026-12-01T00:00:00Z","deletionTimestamp":"2026-12-01T01:00:00Z"}}]}`)
		case r.Method == "PATCH" && broken.Load():
			w.WriteHeader(http.StatusInternalServerError)
		case r.Method == "PATCH":
			w.WriteHeader(http.StatusForbidden)
			io.WriteString(w, `{"kind":"Status","message":"forbidden"}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	c, err := New(Config{Server: srv.URL, Namespace: "ns", Cluster: "c"})
	if err != nil {
		t.Fatal(err)
	}
	c.http = srv.Client()
	var failed []planner.Pool
	pc := ForPlanner(c, nil, func(p planner.Pool) { failed = append(failed, p) })

	rs := pc.Replicas(planner.Aggregated)
	if len(rs) != 2 || rs[0].Name != "c-both-1" || rs[0].Draining || !rs[1].Draining {
		t.Fatalf("replicas %+v, want c-both-1 serving and c-both-2 draining", rs)
	}
	if err := pc.Scale(context.Background(), planner.Aggregated, 3, nil); !errors.Is(err, planner.ErrRefused) {
		t.Errorf("a forbidden scale: %v, want a refusal", err)
	}
	broken.Store(true)
	if again := pc.Replicas(planner.Aggregated); len(again) != 2 || again[0] != rs[0] {
		t.Errorf("replicas while the server fails: %+v, want the last list read", again)
	}
	if len(failed) != 1 || failed[0] != planner.Aggregated {
		t.Errorf("failed reads counted %v, want one for the aggregated pool", failed)
	}
	if err := pc.Scale(context.Background(), planner.Aggregated, 3, nil); err == nil || errors.Is(err, planner.ErrRefused) {
		t.Errorf("a scale the server fails at: %v, want an error that is not a refusal", err)
	}
}
