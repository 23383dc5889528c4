package live

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"tandem/cluster"
	"tandem/llm"
	"tandem/router"
)

// clusterAdapters is the LoRA adapters of a model's workers, as their load reports list
// them, and those loaded through the router's run-time API: /v1/models shows them, and a
// request naming one is routed to a worker that serves it, the router loading it on one
// first where none does.
type clusterAdapters struct {
	l *Router
	m *liveModel
}

func (a *clusterAdapters) Adapters() []llm.AdapterInfo {
	a.l.mu.Lock()
	defer a.l.mu.Unlock()
	out := a.m.state.Adapters()
	for name, path := range a.m.adapters {
		i := slices.IndexFunc(out, func(x llm.AdapterInfo) bool { return x.Name == name })
		if i < 0 {
			out = append(out, llm.AdapterInfo{Name: name, Path: path}) // loaded on no worker now
			continue
		}
		out[i].Path = path
	}
	slices.SortFunc(out, func(x, y llm.AdapterInfo) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// LoadAdapter registers the adapter at path (a path on the workers' machines) and loads it
// on one worker at once, so that a bad path is answered now.
func (a *clusterAdapters) LoadAdapter(ctx context.Context, name, path string) error {
	l, m := a.l, a.m
	l.mu.Lock()
	_, known := m.adapters[name]
	_, served := m.state.AdapterSalt(name)
	l.mu.Unlock()
	if known || served {
		return fmt.Errorf("%w: the LoRA adapter %q is loaded already (unload it first)", llm.ErrInvalid, name)
	}
	if err := l.loadAdapter(ctx, m, name, path); err != nil {
		return err
	}
	l.mu.Lock()
	if m.adapters == nil {
		m.adapters = map[string]string{}
	}
	m.adapters[name] = path
	l.mu.Unlock()
	return nil
}

// UnloadAdapter forgets the adapter and unloads it from every worker that serves it.
func (a *clusterAdapters) UnloadAdapter(name string) error {
	l, m := a.l, a.m
	l.mu.Lock()
	_, known := m.adapters[name]
	delete(m.adapters, name)
	var ws []*liveWorker
	for _, id := range m.state.Workers() {
		if st, ok := m.state.Worker(id); ok {
			if _, ok := st.Report.Adapter(name); ok && l.workers[id] != nil {
				ws = append(ws, l.workers[id])
			}
		}
	}
	l.mu.Unlock()
	if !known && len(ws) == 0 {
		return fmt.Errorf("%w: no LoRA adapter %q is loaded", llm.ErrInvalid, name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var failed []string
	for _, w := range ws {
		if err := w.client.Call(ctx, cluster.MethodUnloadAdapter, &cluster.AdapterRequest{Name: name}, &cluster.AdapterReply{}); err != nil {
			failed = append(failed, w.node+": "+err.Error())
		}
	}
	if len(failed) > 0 {
		l.log.Warn("unloading a LoRA adapter failed on some workers", "adapter", name, "errors", strings.Join(failed, "; "))
		return fmt.Errorf("unloading the LoRA adapter %q failed on %s", name, strings.Join(failed, "; "))
	}
	return nil
}

// loadAdapter loads the adapter on the worker the policy picks for a request without one
// (the cheapest by load), and records that it serves it.
func (l *Router) loadAdapter(ctx context.Context, m *liveModel, name, path string) error {
	l.mu.Lock()
	l.drainLocked()
	d, err := m.state.Decide(router.Request{PromptTokens: 1, Now: time.Now()})
	var w *liveWorker
	if err == nil {
		m.state.RemoveInflight(d.Inflight)
		w = l.workers[d.Worker]
	}
	l.mu.Unlock()
	if err != nil {
		return fmt.Errorf("loading the LoRA adapter %q: %w", name, err)
	}
	if w == nil {
		return fmt.Errorf("%w: loading the LoRA adapter %q: the worker left", llm.ErrUnavailable, name)
	}
	return l.loadAdapterOn(ctx, m, w, name, path)
}

// loadAdapterOn loads the adapter on worker w and records that w serves it.
func (l *Router) loadAdapterOn(ctx context.Context, m *liveModel, w *liveWorker, name, path string) error {
	t0 := time.Now()
	var rep cluster.AdapterReply
	if err := w.client.Call(ctx, cluster.MethodLoadAdapter, &cluster.AdapterRequest{Name: name, Path: path}, &rep); err != nil {
		l.met.AdapterLoads.WithLabelValues("error").Inc()
		l.log.Warn("loading a LoRA adapter on a worker failed", "adapter", name, "path", path, "worker", w.node, "err", err)
		return fmt.Errorf("%w: loading the LoRA adapter %q on %s: %v", llm.ErrInvalid, name, w.node, err)
	}
	l.met.AdapterLoads.WithLabelValues("ok").Inc()
	l.mu.Lock()
	m.state.NoteAdapter(w.id, name, rep.ID)
	l.mu.Unlock()
	l.log.Info("LoRA adapter loaded on a worker", "adapter", name, "worker", w.node, "id", rep.ID, "took", time.Since(t0))
	return nil
}

// adapterSalt is the salt of the adapter's sequences, loading the adapter on a worker
// first when the router's API registered it and no worker serves it now.
func (l *Router) adapterSalt(ctx context.Context, m *liveModel, name string) (uint64, error) {
	l.mu.Lock()
	salt, ok := m.state.AdapterSalt(name)
	path, known := m.adapters[name]
	l.mu.Unlock()
	if ok {
		return salt, nil
	}
	if !known {
		return 0, fmt.Errorf("%w: %q", router.ErrNoAdapter, name)
	}
	if err := l.loadAdapter(ctx, m, name, path); err != nil {
		return 0, err
	}
	l.mu.Lock()
	salt, ok = m.state.AdapterSalt(name)
	l.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("%w: %q", router.ErrNoAdapter, name)
	}
	return salt, nil
}
