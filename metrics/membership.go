package metrics

import "github.com/prometheus/client_golang/prometheus"

// Membership holds the router's metrics of who may be in the cluster: joins (a node
// earning its certificate with the join token) and registrations refused for the node's
// name. Registrations refused for their model card are Router.Refused.
type Membership struct {
	// JoinsRefused counts join attempts refused, by reason: token (not the cluster's
	// token), rate_limited (too many attempts from one address), bad_request.
	JoinsRefused *prometheus.CounterVec
	// NameRefusals counts registrations refused for their node name, by reason:
	// certificate_name (the card's name is not the one in the certificate), name_in_use
	// (another live worker has it), shared_identity (two live processes hold one identity).
	NameRefusals *prometheus.CounterVec
}

// NewMembership registers the router's membership metrics on reg.
func NewMembership(reg prometheus.Registerer) *Membership {
	f := factory{reg: reg}
	vec := func(name, help, label string) *prometheus.CounterVec {
		return f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{label})).(*prometheus.CounterVec)
	}
	return &Membership{
		JoinsRefused: vec("tandem_router:join_refusals_total",
			"Join attempts refused, by reason: token, rate_limited, bad_request.", "reason"),
		NameRefusals: vec("tandem_router:worker_name_refusals_total",
			"Worker registrations refused for their node name, by reason: certificate_name, name_in_use, shared_identity.", "reason"),
	}
}

// Worker holds an engine's metrics of its cluster membership.
type Worker struct {
	// OrphansCanceled counts requests a router had sent this engine that were canceled
	// because that router was lost (its heartbeat replies stopped or its connection died).
	OrphansCanceled prometheus.Counter
	// RouterLosses counts registrations this engine gave up on while not stopping, by
	// cause: beats (the router's beats on the registration stream stopped), connection
	// (the router's connection to this engine, which carries its Worker.Publish stream,
	// ended), other (a heartbeat or event call unanswered, the registration or its
	// connection ended, ...).
	RouterLosses *prometheus.CounterVec
	// ProbedRegistrations counts registrations with a router that does not beat
	// (cluster.RegisterReply.BeatMs 0, a router before beats), under which the engine
	// falls back to telling it alive by Router.Heartbeat calls.
	ProbedRegistrations prometheus.Counter
}

// NewWorker registers an engine's membership metrics on reg.
func NewWorker(reg prometheus.Registerer) *Worker {
	f := factory{reg: reg}
	return &Worker{
		OrphansCanceled: f.counter("tandem:router_lost_requests_canceled_total",
			"Requests canceled because the router that sent them was lost (its heartbeat replies stopped or its connection died)."),
		RouterLosses: f.register(prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tandem:router_losses_total",
			Help: "Router registrations given up while not stopping, by cause: beats (the router's beats stopped), connection (the router's connection to this engine ended), other."},
			[]string{"cause"})).(*prometheus.CounterVec),
		ProbedRegistrations: f.counter("tandem:router_probed_registrations_total",
			"Registrations with a router that does not beat on the registration stream (an older router), which this engine tells alive by Router.Heartbeat calls."),
	}
}
