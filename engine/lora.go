package engine

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"tandem/kvcache"
	"tandem/llm"
	"tandem/model"
)

// DefaultMaxAdapters is how many LoRA adapters stay resident when Config.MaxAdapters is 0.
const DefaultMaxAdapters = 8

// maxAdapterName bounds an adapter's name (it is a metric label and an API model id).
const maxAdapterName = 128

// adapterTable is the engine's LoRA adapters by name: every registered one keeps its path;
// at most max keep their weights in memory, the least recently used evicted past that and
// read again from the path when next asked for. Sequences hold their adapter's weights
// themselves, so an eviction or an unload never disturbs one that runs.
type adapterTable struct {
	mu     sync.Mutex
	max    int
	byName map[string]*adapterEntry
	tick   uint64
}

type adapterEntry struct {
	name, path string
	a          *model.Adapter // nil: evicted
	info       llm.AdapterInfo
	salt       uint64
	used       uint64 // tick of the last use
}

// adapterSalt is the block hash salt of the sequences under adapter a named name: the
// contract's Salt(model, namespace, lora) with lora the name and the content's ID, so that
// a name reloaded with other weights never matches the old KV.
func (e *Engine) adapterSalt(name string, a *model.Adapter) uint64 {
	return kvcache.Salt(e.cfg.ServedName, "", name+"@"+a.ID)
}

// checkAdapterName refuses names a request could not use or a metric label should not be.
func (e *Engine) checkAdapterName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: an adapter needs a name", llm.ErrInvalid)
	case len(name) > maxAdapterName:
		return fmt.Errorf("%w: adapter name of %d bytes (at most %d)", llm.ErrInvalid, len(name), maxAdapterName)
	case name == e.cfg.ServedName:
		return fmt.Errorf("%w: adapter name %q is the base model's", llm.ErrInvalid, name)
	case strings.IndexFunc(name, func(r rune) bool { return unicode.IsSpace(r) || !unicode.IsPrint(r) }) >= 0:
		return fmt.Errorf("%w: adapter name %q holds spaces or control characters", llm.ErrInvalid, name)
	}
	return nil
}

// readAdapter reads the adapter at path for the engine's model, timed and counted.
func (e *Engine) readAdapter(path string) (*model.Adapter, error) {
	if e.runner == nil {
		return nil, fmt.Errorf("%w: this engine's backend (a modelled forward pass) cannot apply LoRA adapters", llm.ErrInvalid)
	}
	if err := model.CanAdapt(e.runner.Be); err != nil {
		return nil, fmt.Errorf("%w: %v", llm.ErrInvalid, err)
	}
	t0 := time.Now()
	a, err := model.LoadAdapter(path, e.m, e.runner.Be)
	if met := e.cfg.Metrics; met != nil {
		result := "ok"
		if err != nil {
			result = "error"
		}
		met.LoRALoads.WithLabelValues(result).Inc()
		met.LoRALoadSeconds.Observe(time.Since(t0).Seconds())
	}
	if err != nil {
		e.log.Warn("LoRA adapter load failed", "path", path, "err", err)
		return nil, fmt.Errorf("%w: %v", llm.ErrInvalid, err)
	}
	return a, nil
}

// LoadAdapter reads the LoRA adapter at path (a llama.cpp GGUF adapter file or a PEFT
// directory) and serves it under name: requests naming it (llm.Request.Adapter) run with
// it, batched with every other adapter's and the base model's. Past the resident budget
// the least recently used adapter's weights are evicted (it stays registered). A bad
// name, a name in use, or an adapter that does not fit the model is an llm.ErrInvalid.
func (e *Engine) LoadAdapter(ctx context.Context, name, path string) error {
	if e.pipelineKV {
		// The stages run their layers without it: the tokens would be neither the base
		// model's nor the adapter's.
		return fmt.Errorf("%w: LoRA adapters on a pipeline replica are not built (its stages hold none)", llm.ErrInvalid)
	}
	if err := e.checkAdapterName(name); err != nil {
		return err
	}
	t := &e.adapters
	t.mu.Lock()
	_, taken := t.byName[name]
	t.mu.Unlock()
	if taken {
		return fmt.Errorf("%w: the LoRA adapter %q is loaded already (unload it first)", llm.ErrInvalid, name)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	a, err := e.readAdapter(path)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, taken := t.byName[name]; taken {
		return fmt.Errorf("%w: the LoRA adapter %q is loaded already (unload it first)", llm.ErrInvalid, name)
	}
	t.tick++
	en := &adapterEntry{name: name, path: path, a: a, salt: e.adapterSalt(name, a), used: t.tick,
		info: llm.AdapterInfo{Name: name, Path: path, Format: a.Format, ID: a.ID, Rank: a.Rank}}
	t.byName[name] = en
	e.evictAdapters(en)
	e.adapterGauges()
	e.log.Info("LoRA adapter loaded", "name", name, "path", path, "format", a.Format, "rank", a.Rank,
		"targets", strings.Join(a.Targets, ","), "bytes", a.Bytes, "id", a.ID)
	return nil
}

// UnloadAdapter stops serving the adapter name: new requests naming it are refused;
// running ones finish with it.
func (e *Engine) UnloadAdapter(name string) error {
	t := &e.adapters
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.byName[name]; !ok {
		return fmt.Errorf("%w: no LoRA adapter %q is loaded", llm.ErrInvalid, name)
	}
	delete(t.byName, name)
	e.adapterGauges()
	e.log.Info("LoRA adapter unloaded", "name", name)
	return nil
}

// Adapters lists the registered adapters by name.
func (e *Engine) Adapters() []llm.AdapterInfo {
	t := &e.adapters
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]llm.AdapterInfo, 0, len(t.byName))
	for _, en := range t.byName {
		info := en.info
		info.Resident = en.a != nil
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b llm.AdapterInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// evictAdapters drops the weights of the least recently used resident adapters other than
// keep while more than the budget are resident. Called with t.mu held.
func (e *Engine) evictAdapters(keep *adapterEntry) {
	t := &e.adapters
	for {
		var resident int
		var lru *adapterEntry
		for _, en := range t.byName {
			if en.a == nil {
				continue
			}
			resident++
			if en != keep && (lru == nil || en.used < lru.used) {
				lru = en
			}
		}
		if resident <= t.max || lru == nil {
			return
		}
		lru.a = nil
		if e.cfg.Metrics != nil {
			e.cfg.Metrics.LoRAEvictions.Inc()
		}
		e.log.Info("LoRA adapter evicted from memory (past the resident budget); it is read again when next asked for",
			"name", lru.name, "budget", t.max)
	}
}

// adapterGauges publishes the table's counts. Called with t.mu held.
func (e *Engine) adapterGauges() {
	met := e.cfg.Metrics
	if met == nil {
		return
	}
	var resident int
	for _, en := range e.adapters.byName {
		if en.a != nil {
			resident++
		}
	}
	met.LoRARegistered.Set(float64(len(e.adapters.byName)))
	met.LoRAResident.Set(float64(resident))
}

// useAdapter returns the weights and salt of the adapter a request names, reading them
// again if they were evicted.
func (e *Engine) useAdapter(name string) (*model.Adapter, uint64, error) {
	t := &e.adapters
	t.mu.Lock()
	en := t.byName[name]
	if en == nil {
		t.mu.Unlock()
		return nil, 0, fmt.Errorf("%w: the model %q does not exist (no such LoRA adapter is loaded)", llm.ErrInvalid, name)
	}
	t.tick++
	en.used = t.tick
	a, path := en.a, en.path
	t.mu.Unlock()
	if a == nil {
		var err error
		if a, err = e.readAdapter(path); err != nil {
			return nil, 0, err
		}
		t.mu.Lock()
		if t.byName[name] == en {
			if en.a == nil {
				// The file may have changed since it was first read: the salt follows its
				// content, so the new weights never match the old KV.
				en.a, en.salt, en.info.ID = a, e.adapterSalt(name, a), a.ID
				e.evictAdapters(en)
				e.adapterGauges()
			}
			a = en.a
		}
		salt := e.adapterSalt(name, a)
		t.mu.Unlock()
		if e.cfg.Metrics != nil {
			e.cfg.Metrics.LoRARequests.WithLabelValues(name).Inc()
		}
		return a, salt, nil
	}
	if e.cfg.Metrics != nil {
		e.cfg.Metrics.LoRARequests.WithLabelValues(name).Inc()
	}
	return a, en.salt, nil
}
