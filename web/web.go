// Package web is the live dashboard of tandem and tandem-router: static pages embedded in
// the binary, and a stream of snapshots of the process's own metrics that they draw.
package web

import (
	"crypto/subtle"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"tandem/metrics"
	"tandem/sla"
)

// Paths the dashboard answers; everything else goes to the wrapped handler.
const (
	Path       = "/dashboard"
	EventsPath = Path + "/events"
	ConfigPath = Path + "/config.json" // the page's kind and whether the stream needs a key; no data
)

// Defaults for zero Config fields.
const (
	DefaultPeriod     = 250 * time.Millisecond
	DefaultMaxStreams = 16
)

// writeTimeout bounds one snapshot's write: a client that stops reading is dropped
// instead of holding its handler (and the server's drain) forever.
const writeTimeout = 10 * time.Second

//go:embed assets
var assets embed.FS

// Kind says which process a dashboard shows, and so which panels the page draws and which
// metric families a snapshot carries.
type Kind string

// Kinds.
const (
	Engine Kind = "engine" // tandem serve: metrics named tandem:…
	Router Kind = "router" // tandem-router: metrics named tandem_router:…
)

// prefix is the kind's metric namespace.
func (k Kind) prefix() string {
	if k == Router {
		return "tandem_router"
	}
	return "tandem"
}

// Source gives the dashboard the process's metrics. *prometheus.Registry is one.
type Source interface {
	Gather() ([]*dto.MetricFamily, error)
}

// Config configures a Dashboard. Kind and Source are required.
type Config struct {
	Kind   Kind
	Name   string // shown in the page's title: the model or the router's name
	Source Source
	// Registerer receives the dashboard's own metrics (metrics.Dashboard: streams, refusals,
	// SLA targets). It is usually the registry Source reads, so the page sees them too.
	// Nil: none.
	Registerer prometheus.Registerer
	// APIKey, if set, is the bearer token the data stream needs: the API's key. The page
	// and its scripts hold no data and need none.
	APIKey string
	SLA    sla.Targets // drawn on the latency charts; zero fields take sla.Default's
	// Period is the time between two snapshots (default DefaultPeriod); MaxStreams bounds
	// the data streams open at once (default DefaultMaxStreams), each costing a gather
	// of the registry per period.
	Period     time.Duration
	MaxStreams int
	Logger     *slog.Logger
}

// Dashboard serves the pages at Path and the data stream at EventsPath.
type Dashboard struct {
	cfg          Config
	log          *slog.Logger
	met          *metrics.Dashboard
	files        http.Handler
	open         atomic.Int64
	stop         atomic.Pointer[func() bool]
	gatherWarned atomic.Bool
}

// New checks cfg and returns a Dashboard.
func New(cfg Config) (*Dashboard, error) {
	switch cfg.Kind {
	case Engine, Router:
	default:
		return nil, fmt.Errorf("web: dashboard kind %q (want %q or %q)", cfg.Kind, Engine, Router)
	}
	if cfg.Source == nil {
		return nil, errors.New("web: a dashboard needs a metrics source")
	}
	if cfg.SLA.TTFT == 0 {
		cfg.SLA.TTFT = sla.Default.TTFT
	}
	if cfg.SLA.ITL == 0 {
		cfg.SLA.ITL = sla.Default.ITL
	}
	if err := cfg.SLA.Check(); err != nil {
		return nil, err
	}
	if cfg.Period <= 0 {
		cfg.Period = DefaultPeriod
	}
	if cfg.MaxStreams <= 0 {
		cfg.MaxStreams = DefaultMaxStreams
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	sub, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	d := &Dashboard{cfg: cfg, log: cfg.Logger, files: http.StripPrefix(Path+"/", http.FileServerFS(sub))}
	if cfg.Registerer != nil {
		d.met = metrics.NewDashboard(cfg.Registerer, cfg.Kind.prefix())
		d.met.SLATarget.WithLabelValues("ttft").Set(cfg.SLA.TTFT.Seconds())
		d.met.SLATarget.WithLabelValues("itl").Set(cfg.SLA.ITL.Seconds())
	}
	return d, nil
}

// StopWhen makes open data streams end (with an "end" event, which the page shows)
// within a period of draining() turning true: the HTTP server's drain waits for running
// requests, and a dashboard left open would otherwise hold it to its deadline. Pass the
// server's Draining method.
func (d *Dashboard) StopWhen(draining func() bool) { d.stop.Store(&draining) }

func (d *Dashboard) stopping() bool {
	f := d.stop.Load()
	return f != nil && (*f)()
}

// Wrap returns a handler that serves the dashboard's paths and hands every other request
// to next.
func (d *Dashboard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == Path || strings.HasPrefix(r.URL.Path, Path+"/") {
			d.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// ServeHTTP serves Path (a redirect to Path/), the page and its assets under Path/, and
// the data stream at EventsPath.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
			fmt.Sprintf("%s %s: the dashboard answers GET only.", r.Method, r.URL.Path))
		return
	}
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
	switch r.URL.Path {
	case Path:
		http.Redirect(w, r, Path+"/", http.StatusMovedPermanently)
	case EventsPath:
		d.events(w, r)
	case ConfigPath:
		// What the page must know before it streams: which panels to build and whether to
		// ask for the key (asking the stream would log a failed request in the console).
		h.Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"kind": d.cfg.Kind, "key_required": d.cfg.APIKey != ""})
	default:
		// Scripts and styles from this origin only, no inline code, no framing: the page
		// shows worker names the cluster chose, and writes them as text, never as markup.
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
		h.Set("X-Frame-Options", "DENY")
		d.files.ServeHTTP(w, r)
	}
}

// events streams snapshots as server-sent events ("event: snapshot", the JSON of a
// Snapshot) every period until the client goes away, a write fails or the server drains.
func (d *Dashboard) events(w http.ResponseWriter, r *http.Request) {
	if d.cfg.APIKey != "" && !bearerIs(r, d.cfg.APIKey) {
		d.refused("unauthorized")
		w.Header().Set("WWW-Authenticate", "Bearer")
		writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key",
			"Invalid or missing API key: the dashboard's data needs \"Authorization: Bearer <key>\" (the server's --api-key).")
		return
	}
	if n := d.open.Add(1); n > int64(d.cfg.MaxStreams) {
		d.open.Add(-1)
		d.refused("too_many")
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, "server_error", "too_many_streams",
			fmt.Sprintf("The dashboard already streams to %d clients; close one and retry.", d.cfg.MaxStreams))
		return
	}
	defer d.open.Add(-1)
	if d.met != nil {
		d.met.Streams.Inc()
		defer d.met.Streams.Dec()
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // proxies: do not hold the stream back
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	rc := http.NewResponseController(w)
	tick := time.NewTicker(d.cfg.Period)
	defer tick.Stop()
	var buf []byte
	for {
		if d.stopping() {
			d.write(w, rc, append(buf[:0], "event: end\ndata: {\"reason\":\"the server is shutting down\"}\n\n"...))
			return
		}
		buf = append(buf[:0], "event: snapshot\ndata: "...)
		buf = d.appendSnapshot(buf, time.Now())
		buf = append(buf, "\n\n"...)
		if !d.write(w, rc, buf) {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
		}
	}
}

// write sends one event and flushes it, within writeTimeout.
func (d *Dashboard) write(w http.ResponseWriter, rc *http.ResponseController, b []byte) bool {
	// Not every transport has write deadlines (HTTP/3 may not); those rely on the
	// client's going away.
	_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := w.Write(b); err != nil {
		return false
	}
	return rc.Flush() == nil
}

// appendSnapshot appends the JSON of the process's snapshot at now.
func (d *Dashboard) appendSnapshot(buf []byte, now time.Time) []byte {
	fams, err := d.cfg.Source.Gather()
	if err != nil && !d.gatherWarned.Swap(true) {
		// A registry inconsistency, not a passing condition: said once, and shown on the
		// page with every snapshot.
		d.log.Error("dashboard: gathering the metrics failed; snapshots are incomplete", "err", err)
	}
	s := Build(d.cfg.Kind, d.cfg.Name, d.cfg.SLA, d.cfg.Period, fams, now)
	if err != nil {
		s.Error = err.Error()
	}
	data, merr := json.Marshal(s)
	if merr != nil { // cannot happen: every number is finite or null
		data, _ = json.Marshal(Snapshot{Time: now.UnixMilli(), Kind: d.cfg.Kind, Error: "encoding the snapshot: " + merr.Error()})
	}
	return append(buf, data...)
}

func (d *Dashboard) refused(reason string) {
	if d.met != nil {
		d.met.Refused.WithLabelValues(reason).Inc()
	}
}

// bearerIs reports whether r carries "Authorization: Bearer token", compared in
// constant time.
func bearerIs(r *http.Request, token string) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(token)) == 1
}

// writeError answers with an OpenAI-style error body, as the API beside the dashboard does.
func writeError(w http.ResponseWriter, status int, typ, code, msg string) {
	data, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": code}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(data, '\n'))
}
