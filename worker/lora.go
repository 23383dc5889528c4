package worker

import (
	"context"
	"errors"

	"tandem/cluster"
	"tandem/llm"
	"tandem/orpc"
)

// adapterLoader is an Engine that loads LoRA adapters at run time (tandem/engine.Engine).
type adapterLoader interface {
	adapterEngine
	LoadAdapter(ctx context.Context, name, path string) error
	UnloadAdapter(name string) error
}

func (w *Worker) registerAdapters(srv *orpc.Server) {
	orpc.Unary(srv, cluster.MethodLoadAdapter, w.loadAdapter)
	orpc.Unary(srv, cluster.MethodUnloadAdapter, w.unloadAdapter)
}

// adapterID is the content ID of the engine's adapter name.
func adapterID(e adapterEngine, name string) (string, bool) {
	for _, a := range e.Adapters() {
		if a.Name == name {
			return a.ID, true
		}
	}
	return "", false
}

// loadAdapter serves Worker.LoadAdapter: an adapter loaded already under the name answers
// its ID (a router may ask twice, or after the worker's own --lora).
func (w *Worker) loadAdapter(ctx context.Context, req *cluster.AdapterRequest) (*cluster.AdapterReply, error) {
	e, ok := w.cfg.Engine.(adapterLoader)
	if !ok {
		return nil, orpc.Error(orpc.InvalidArgument, "this worker's engine cannot load LoRA adapters")
	}
	if id, ok := adapterID(e, req.Name); ok {
		return &cluster.AdapterReply{ID: id}, nil
	}
	if err := e.LoadAdapter(ctx, req.Name, req.Path); err != nil {
		if errors.Is(err, llm.ErrInvalid) {
			return nil, orpc.Error(orpc.InvalidArgument, err.Error())
		}
		return nil, err
	}
	id, _ := adapterID(e, req.Name)
	w.log.Info("LoRA adapter loaded at a router's request", "name", req.Name, "path", req.Path, "id", id)
	return &cluster.AdapterReply{ID: id}, nil
}

func (w *Worker) unloadAdapter(ctx context.Context, req *cluster.AdapterRequest) (*cluster.AdapterReply, error) {
	e, ok := w.cfg.Engine.(adapterLoader)
	if !ok {
		return nil, orpc.Error(orpc.InvalidArgument, "this worker's engine cannot load LoRA adapters")
	}
	if err := e.UnloadAdapter(req.Name); err != nil {
		return nil, orpc.Error(orpc.InvalidArgument, err.Error())
	}
	return &cluster.AdapterReply{}, nil
}
