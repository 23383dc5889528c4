package openai

import (
	"context"
	"fmt"
	"net/http"

	"tandem/llm"
)

// AdapterServer is a backend that serves LoRA adapters of its model (the engine): a
// request whose model field names one of them runs under it (llm.Request.Adapter).
type AdapterServer interface {
	Adapters() []llm.AdapterInfo
	LoadAdapter(ctx context.Context, name, path string) error
	UnloadAdapter(name string) error
}

// adapterModel finds the served model one of whose adapters is called name: that model
// under the adapter's name, which requests and answers carry.
func (h *handler) adapterModel(name string) *Model {
	for _, m := range h.models {
		if m.Adapters == nil {
			continue
		}
		for _, a := range m.Adapters.Adapters() {
			if a.Name == name {
				return m.underAdapter(name)
			}
		}
	}
	return nil
}

// underAdapter is m as the adapter name serves it: m's settings under the adapter's name.
func (m *Model) underAdapter(name string) *Model {
	return &Model{ID: name, Tokenizer: m.Tokenizer, ContextLen: m.ContextLen, Created: m.Created, OwnedBy: m.OwnedBy,
		Backend: m.Backend, ChatTemplate: m.ChatTemplate, ToolCallParser: m.ToolCallParser, ReasoningParser: m.ReasoningParser,
		NoConstraints: m.NoConstraints, NoTokenControls: m.NoTokenControls, Pooling: m.Pooling, Adapters: m.Adapters,
		adapter: name, parent: m}
}

// adapterServer is the model the run-time adapter API acts on: the only one that serves
// adapters.
func (h *handler) adapterServer() (*Model, *apiError) {
	var found *Model
	for _, m := range h.models {
		if m.Adapters != nil {
			if found != nil {
				return nil, badRequest("", "More than one model serves LoRA adapters; this server cannot tell which one to load into.")
			}
			found = m
		}
	}
	if found == nil {
		return nil, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", code: "not_found", msg: "No model served here takes LoRA adapters."}
	}
	return found, nil
}

type loadAdapterRequest struct {
	Name string `json:"lora_name"`
	Path string `json:"lora_path"`
}

// readAdapterRequest reads the body of a load or unload request and finds the model that
// serves adapters.
func (h *handler) readAdapterRequest(w http.ResponseWriter, r *http.Request, info *reqInfo) (loadAdapterRequest, *Model, *apiError) {
	var req loadAdapterRequest
	if aerr := h.readJSON(w, r, 1<<20, &req); aerr != nil {
		return req, nil, aerr
	}
	info.model = req.Name
	m, aerr := h.adapterServer()
	return req, m, aerr
}

// loadAdapter is vLLM's POST /v1/load_lora_adapter {"lora_name", "lora_path"}.
func (h *handler) loadAdapter(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	req, m, aerr := h.readAdapterRequest(w, r, info)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	switch {
	case req.Name == "" || req.Path == "":
		writeError(w, badRequest("lora_name", "Both 'lora_name' and 'lora_path' must be provided."))
		return
	case h.byID[req.Name] != nil:
		writeError(w, badRequest("lora_name", "The name %q is a served model's; an adapter needs its own.", req.Name))
		return
	}
	if err := m.Adapters.LoadAdapter(r.Context(), req.Name, req.Path); err != nil {
		writeError(w, backendError(err))
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' added successfully.", req.Name)
}

// unloadAdapter is vLLM's POST /v1/unload_lora_adapter {"lora_name"}.
func (h *handler) unloadAdapter(w http.ResponseWriter, r *http.Request, info *reqInfo) {
	req, m, aerr := h.readAdapterRequest(w, r, info)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if req.Name == "" {
		writeError(w, badRequest("lora_name", "'lora_name' must be provided."))
		return
	}
	if err := m.Adapters.UnloadAdapter(req.Name); err != nil {
		writeError(w, &apiError{status: http.StatusNotFound, typ: "invalid_request_error", param: "lora_name", code: "model_not_found", msg: err.Error()})
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintf(w, "Success: LoRA adapter '%s' removed successfully.", req.Name)
}

// adapterObjects are m's adapters as /v1/models lists them (vLLM's shape: root is the
// adapter's path, parent the base model).
func (m *Model) adapterObjects() []modelObject {
	if m.Adapters == nil {
		return nil
	}
	var out []modelObject
	for _, a := range m.Adapters.Adapters() {
		o := m.object()
		o.ID, o.Root, o.Parent = a.Name, a.Path, m.ID
		out = append(out, o)
	}
	return out
}
