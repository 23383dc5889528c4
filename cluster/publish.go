package cluster

import (
	"fmt"

	"tandem/orpc"
)

// MethodPublish is the worker's stream of load reports and KV event batches for one
// registration, opened by the router (docs/orpc.md, "Membership"): one message each,
// where a unary Router.Heartbeat or Router.Events call costs a QUIC stream opened and
// closed, and a handler, at both ends. A worker that does not serve it (older) keeps
// making those calls; a router that does not open it (older) gets them.
const MethodPublish = "Worker.Publish"

// PublishRequest opens Worker.Publish for the registration whose RegisterReply carried
// DispatchKey.
type PublishRequest struct {
	DispatchKey uint64
}

// MarshalORPC implements orpc.Marshaler.
func (r *PublishRequest) MarshalORPC(e *orpc.Encoder) { e.Uint64(r.DispatchKey) }

// UnmarshalORPC implements orpc.Unmarshaler.
func (r *PublishRequest) UnmarshalORPC(d *orpc.Decoder) error {
	r.DispatchKey = d.Uint64()
	return d.Err()
}

// PublicationKind says what a Publication carries.
type PublicationKind uint8

// Publication kinds.
const (
	PublishReport PublicationKind = 1 // a LoadReport, as Router.Heartbeat's request
	PublishEvents PublicationKind = 2 // a KVEvents batch, as Router.Events's request
)

// Publication is one message of Worker.Publish: u8 kind, then the report's or the
// batch's encoding.
type Publication struct {
	Kind   PublicationKind
	Report LoadReport // PublishReport
	Events KVEvents   // PublishEvents
}

// MarshalORPC implements orpc.Marshaler.
func (p *Publication) MarshalORPC(e *orpc.Encoder) {
	e.Uint8(uint8(p.Kind))
	switch p.Kind {
	case PublishReport:
		p.Report.MarshalORPC(e)
	case PublishEvents:
		p.Events.MarshalORPC(e)
	}
}

// UnmarshalORPC implements orpc.Unmarshaler. A kind it does not know is an error: the
// router then ends the stream and the worker makes calls again.
func (p *Publication) UnmarshalORPC(d *orpc.Decoder) error {
	p.Kind = PublicationKind(d.Uint8())
	switch p.Kind {
	case PublishReport:
		return p.Report.UnmarshalORPC(d)
	case PublishEvents:
		return p.Events.UnmarshalORPC(d)
	}
	if d.Err() == nil {
		d.Fail(fmt.Errorf("cluster: publication of kind %d", p.Kind))
	}
	return d.Err()
}
