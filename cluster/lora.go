package cluster

import "tandem/orpc"

// The LoRA adapter methods a router calls on a worker (its run-time adapter API, and a
// load where a request names an adapter no worker serves yet).
const (
	// MethodLoadAdapter loads an adapter from a path on the worker's machine; the reply
	// carries its content ID (its salt is Salt(model, "", NAME@ID)). An adapter loaded
	// already under the name answers its ID.
	MethodLoadAdapter = "Worker.LoadAdapter"
	// MethodUnloadAdapter stops serving an adapter.
	MethodUnloadAdapter = "Worker.UnloadAdapter"
)

// AdapterRequest names an adapter, and for a load its path.
type AdapterRequest struct{ Name, Path string }

// MarshalORPC implements orpc.Marshaler.
func (r *AdapterRequest) MarshalORPC(e *orpc.Encoder) {
	e.String(r.Name)
	e.String(r.Path)
}

// UnmarshalORPC implements orpc.Unmarshaler.
func (r *AdapterRequest) UnmarshalORPC(d *orpc.Decoder) error {
	r.Name = d.String()
	r.Path = d.String()
	return d.Err()
}

// AdapterReply is a loaded adapter's content ID ("" after an unload).
type AdapterReply struct{ ID string }

// MarshalORPC implements orpc.Marshaler.
func (r *AdapterReply) MarshalORPC(e *orpc.Encoder) { e.String(r.ID) }

// UnmarshalORPC implements orpc.Unmarshaler.
func (r *AdapterReply) UnmarshalORPC(d *orpc.Decoder) error {
	r.ID = d.String()
	return d.Err()
}
