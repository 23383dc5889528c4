package live

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"tandem/httpserve"
	"tandem/internal/version"
	"tandem/metrics"
	"tandem/orpc"
	"tandem/respstore"
	"tandem/router"
)

// ServerConfig configures a Server: a live router with its ORPC listener (for workers, with
// token join) and its HTTP server (OpenAI API, /health, /metrics).
type ServerConfig struct {
	Host     string // HTTP and ORPC listen host
	Port     int    // HTTP port (0 picks one)
	ORPCPort int    // ORPC port for workers (0 picks one)
	StateDir string // the cluster CA and join token live here (created on first start)
	// JoinToken is the token workers must prove; "" uses the stored one or generates one.
	JoinToken string
	Router    Config // Identity is made by the server from the CA
	// DrainTimeout bounds Shutdown's wait for running requests.
	DrainTimeout time.Duration
	// BodyReadTimeout and MinBodyRate bound how long a request body may take (see
	// httpserve.Config); zero means httpserve's defaults.
	BodyReadTimeout time.Duration
	MinBodyRate     int64
	// PublicMetrics serves /metrics without the API key (Router.APIKey); /health never
	// needs it.
	PublicMetrics bool
	// WrapHandler, if set, wraps the API handler with the binary's own paths (its
	// dashboard), given the registry of the router's metrics.
	WrapHandler func(api http.Handler, reg *prometheus.Registry) (http.Handler, error)
	// ResponseTTL is how long a stored response (the Responses API) is kept in the
	// response store (0: until deleted), a file in the state directory unless
	// ResponsesPath says where (two routers in one process share no such file).
	ResponseTTL   time.Duration
	ResponsesPath string
	// AllowedOrigins turns CORS on (httpserve.Config.AllowedOrigins); MetricsPrefix adds
	// an alias prefix to /metrics (metrics.Aliased), e.g. "vllm".
	AllowedOrigins []string
	MetricsPrefix  string
	Logger         *slog.Logger
}

// Server is a running tandem-router.
type Server struct {
	Router     *Router
	HTTP       *httpserve.Server
	ORPC       *orpc.Server
	ORPCAddr   string
	Token      orpc.Token
	CACreated  bool
	TokCreated bool

	cancel context.CancelFunc
	done   chan struct{}
	store  *respstore.Store
}

// StartServer loads or creates the cluster CA and join token, then serves ORPC and HTTP in
// the background until Shutdown.
func StartServer(cfg ServerConfig) (*Server, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.StateDir == "" {
		return nil, errors.New("router: a state directory is needed (--state-dir)")
	}
	ca, caCreated, err := orpc.LoadOrCreateCA(cfg.StateDir, log)
	if err != nil {
		return nil, fmt.Errorf("router: cluster CA: %w", err)
	}
	tok, tokCreated, err := orpc.LoadOrCreateToken(cfg.StateDir, cfg.JoinToken)
	if err != nil {
		return nil, fmt.Errorf("router: join token: %w", err)
	}
	var hosts []string
	if ip := net.ParseIP(cfg.Host); cfg.Host != "" && (ip == nil || !ip.IsUnspecified()) {
		hosts = append(hosts, cfg.Host)
	}
	name := cfg.Router.Name
	if name == "" {
		name = "tandem-router"
	}
	id, err := ca.NewIdentity(name, hosts)
	if err != nil {
		return nil, err
	}
	cards := newCardStore(cfg.StateDir)
	known, err := cards.load()
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	reg := metrics.NewRegistry()
	if cfg.ResponsesPath == "" {
		cfg.ResponsesPath = filepath.Join(cfg.StateDir, respstore.FileName)
	}
	store, err := respstore.Open(cfg.ResponsesPath,
		respstore.Options{TTL: cfg.ResponseTTL, Metrics: metrics.NewResponses(reg, "tandem_router"), Logger: log})
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	started := false
	defer func() {
		if !started {
			store.Close()
		}
	}()
	lc := cfg.Router
	lc.Responses = store
	if lc.KnownCards == nil {
		lc.KnownCards = known
	}
	if lc.NewModel == nil {
		lc.NewModel = func(c router.Card) {
			if err := cards.add(c); err != nil {
				log.Error("cannot remember the model's card in the state directory", "model", c.Model, "err", err)
			}
		}
	}
	lc.Identity = id
	lc.Name = name
	lc.Registry = reg
	if lc.Logger == nil {
		lc.Logger = log
	}
	live, err := New(lc)
	if err != nil {
		return nil, err
	}

	srv := orpc.NewServer(orpc.WithLogger(log), orpc.WithAgent(name))
	live.Register(srv)
	srv.EnableJoin(orpc.JoinConfig{
		CA:     ca,
		Tokens: func() []orpc.Token { return []orpc.Token{tok} },
		OnJoin: func(node string, cert *x509.Certificate) {
			log.Info("node joined the cluster", "node", node, "expires", cert.NotAfter.Format(time.DateOnly))
		},
		OnRefused: func(reason string) { live.met.mem.JoinsRefused.WithLabelValues(reason).Inc() },
	})
	ol, err := srv.Listen(net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.ORPCPort)), id.ServerTLS())
	if err != nil {
		return nil, fmt.Errorf("router: ORPC listen: %w", err)
	}

	handler := live.Handler()
	if cfg.WrapHandler != nil {
		if handler, err = cfg.WrapHandler(handler, reg); err != nil {
			ol.Close()
			return nil, err
		}
	}
	metricsToken := cfg.Router.APIKey
	if cfg.PublicMetrics {
		metricsToken = ""
	}
	hs, err := httpserve.New(httpserve.Config{
		Addr:            net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)),
		Handler:         handler,
		Degraded:        live.Degraded,
		Metrics:         metrics.HandlerFor(metrics.Aliased(reg, "tandem_router", cfg.MetricsPrefix)),
		AllowedOrigins:  cfg.AllowedOrigins,
		OnRefused:       func(reason string) { live.httpMet.Refused.WithLabelValues(reason).Inc() },
		MetricsToken:    metricsToken,
		Version:         version.String(),
		DrainTimeout:    cfg.DrainTimeout,
		BodyReadTimeout: cfg.BodyReadTimeout,
		MinBodyRate:     cfg.MinBodyRate,
		Logger:          log,
	})
	if err != nil {
		ol.Close()
		return nil, err
	}
	if err := hs.Start(); err != nil {
		ol.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{Router: live, HTTP: hs, ORPC: srv, ORPCAddr: ol.Addr().String(), Token: tok, CACreated: caCreated,
		TokCreated: tokCreated, cancel: cancel, done: make(chan struct{}), store: store}
	started = true
	go live.Run(ctx)
	go store.Run(ctx)
	go func() {
		defer close(s.done)
		srv.Serve(ctx, ol)
	}()
	return s, nil
}

// URL is the HTTP base URL.
func (s *Server) URL() string { return s.HTTP.URL() }

// Shutdown drains HTTP (running requests finish within ctx), then closes ORPC: workers see
// their registrations end and reconnect to whichever router comes back.
func (s *Server) Shutdown(ctx context.Context) error {
	err := s.HTTP.Shutdown(ctx)
	s.cancel()
	<-s.done
	if cerr := s.store.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("router: closing the response store: %w", cerr)
	}
	return err
}
