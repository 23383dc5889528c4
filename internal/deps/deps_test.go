package deps

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// allowed lists, for every package of the module, the module's packages it may import
// directly. Dependencies point downward, as in ARCHITECTURE.md's list of rooms; a new
// package is added here on purpose, with its place in that order.
var allowed = map[string][]string{
	// Leaves: the standard library and the third-party modules below.
	"dtype": {}, "llm": {}, "kvcache": {}, "tokenizer": {}, "httpserve": {}, "metrics": {},
	"bench": {}, "bench/benchtest": {},
	"internal/datadriven": {}, "internal/fixtures": {}, "internal/statefile": {}, "internal/costs": {}, "internal/deps": {}, "internal/version": {}, "sla": {}, "grammar": {}, "internal/schematest": {},
	"internal/vulkantest": {"hal/vulkan"},
	"internal/filehash":   {"internal/statefile"},

	// File formats and the device contract.
	"gguf": {"dtype"}, "safetensors": {"dtype"}, "hal": {"dtype"}, "hal/cpu": {"hal"},
	// The Vulkan backend: hal/cpu's host code (dequantization at load, the KV format's name).
	// Only cmd/tandem links it; node takes a hal.Backend, and tests of model, node and
	// cmd/tandem reach it through internal/vulkantest.
	"hal/vulkan": {"hal", "hal/cpu"},

	// Pure cores: no I/O of their own.
	"sched":   {"kvcache", "llm"},
	"router":  {"kvcache", "llm"},
	"planner": {"sla"},
	"sim":     {"bench", "kvcache", "planner", "router", "sched"},
	// The study behind tandem plan: simulations over the planner, and their report.
	"planstudy": {"bench", "planner", "router", "sim", "sla"},

	// The bytes of the KV cache's lower tiers (host arena, disk block files, shared
	// directory): files and goroutines, below the engine, beside the pool's books.
	"kvtier": {"internal/statefile", "kvcache"},

	// The wire.
	"orpc":    {"internal/statefile"},
	"cluster": {"gguf", "kvcache", "llm", "orpc", "tokenizer"},

	// The engine and its model.
	"model":          {"gguf", "hal", "safetensors", "tokenizer"},
	"modelgen":       {"gguf", "hal", "hal/cpu", "model", "tokenizer"},
	"engine":         {"grammar", "hal", "kvcache", "kvtier", "llm", "metrics", "model", "sched", "tokenizer"},
	"engine/simstep": {"engine", "hal", "model", "sim"},
	"packcache":      {"hal", "internal/filehash", "internal/statefile"},
	"pipeline":       {"hal", "llm", "metrics", "model", "orpc"},

	// Serving.
	"openai":        {"grammar", "httpserve", "llm", "metrics", "tokenizer"},
	"respstore":     {"metrics"},
	"bench/loadgen": {"bench"},
	"web":           {"metrics", "sla"},
	"worker":        {"cluster", "engine", "gguf", "kvcache", "llm", "metrics", "orpc"},
	"node":          {"cluster", "engine", "engine/simstep", "gguf", "hal", "httpserve", "internal/filehash", "internal/version", "kvcache", "kvtier", "llm", "metrics", "model", "modelgen", "openai", "orpc", "packcache", "pipeline", "respstore", "sim", "sla", "web", "worker"},
	"router/live":   {"cluster", "gguf", "httpserve", "internal/statefile", "internal/version", "kvcache", "llm", "metrics", "openai", "orpc", "planner", "respstore", "router", "tokenizer"},
	// The planner's connectors: engines as processes on this machine.
	"planner/local": {"planner"},

	// Kubernetes (docs/kubernetes.md): the operator's API, its pure placement core, the
	// operator, and the planner's connector (net/http alone, so tandem-router may link it).
	// Only these, the test API server's harness and cmd/tandem-operator touch Kubernetes.
	"deploy":                 {},
	"k8s/api/v1alpha1":       {},
	"k8s/placement":          {},
	"k8s/connector":          {"planner"},
	"k8s/operator":           {"k8s/api/v1alpha1", "k8s/placement", "orpc"},
	"internal/k8stest":       {},
	"internal/k8stest/build": {"internal/k8stest"},

	// Binaries: flags and wiring.
	"cmd/tandem-router":   {"httpserve", "internal/statefile", "internal/version", "k8s/connector", "metrics", "planner", "planner/local", "router", "router/live", "sim", "sla", "web"},
	"cmd/tandem":          nil, // nil: may import any package of the module
	"cmd/tandem-operator": {"internal/version", "k8s/operator"},
}

// thirdParty lists the only packages that may import each third-party module directly
// (tests may import others: the OpenAI SDK, chromedp).
var thirdParty = map[string][]string{
	"github.com/quic-go/quic-go":          {"orpc", "httpserve"},
	"github.com/prometheus/client_golang": {"metrics", "router/live", "node", "web", "cmd/tandem-router", "k8s/operator"},
	"github.com/prometheus/client_model":  {"metrics", "web"},
	"github.com/ardanlabs/jinja":          {"tokenizer"},
	// The response store alone opens the database file; the API reaches it through
	// openai.ResponseStore, so that the format and its locking stay in one package.
	"go.etcd.io/bbolt": {"respstore"},
	// Kubernetes' client libraries: the operator alone (its API types, its binary).
	"k8s.io/api":                     {"k8s/api/v1alpha1", "k8s/operator"},
	"k8s.io/apimachinery":            {"k8s/api/v1alpha1", "k8s/operator"},
	"k8s.io/client-go":               {"k8s/operator"},
	"sigs.k8s.io/controller-runtime": {"k8s/operator", "cmd/tandem-operator"},
	"github.com/go-logr/logr":        {"cmd/tandem-operator"},
	// The Vulkan loader, opened at run time (no cgo, no headers to build).
	"github.com/ebitengine/purego": {"hal/vulkan"},
}

// never lists what a package must not link at all, directly or through others.
var never = map[string][]string{
	// The pure cores and the packages the simulator and the router binary share: no
	// device, no model, no wire, no HTTP, so that each runs the same code live and in
	// the simulator, and the router binary stays small.
	"sched":     {"tandem/hal", "tandem/model", "tandem/orpc", "net/http", "github.com/quic-go/quic-go"},
	"router":    {"tandem/hal", "tandem/model", "tandem/orpc", "net/http", "github.com/quic-go/quic-go"},
	"planner":   {"tandem/hal", "tandem/model", "tandem/orpc", "net/http", "github.com/quic-go/quic-go", "os/exec"},
	"sim":       {"tandem/hal", "tandem/model", "tandem/orpc", "net/http", "github.com/quic-go/quic-go"},
	"planstudy": {"tandem/hal", "tandem/model", "tandem/orpc", "net/http", "github.com/quic-go/quic-go"},
	"bench":     {"tandem/hal", "tandem/model", "tandem/orpc", "net/http"},
	"kvcache":   {"tandem/hal", "tandem/model", "tandem/orpc", "net/http"},
	"kvtier":    {"tandem/hal", "tandem/model", "tandem/orpc", "net/http"},
	"llm":       {"tandem/hal", "tandem/model", "tandem/orpc", "net/http"},
	"sla":       {"tandem/hal", "tandem/model", "tandem/orpc", "net/http"},
	"grammar":   {"tandem/hal", "tandem/model", "tandem/orpc", "net/http"},
	// The placement core and the connector stay free of Kubernetes' libraries, and so do
	// the engine's and the router's binaries (below).
	"k8s/placement": {"k8s.io", "sigs.k8s.io"},
	"k8s/connector": {"k8s.io", "sigs.k8s.io"},
	// The router binary: pure Go, no engine.
	"cmd/tandem-router": {"tandem/hal", "tandem/hal/cpu", "tandem/hal/vulkan", "tandem/model", "tandem/engine", "tandem/modelgen", "github.com/ebitengine/purego", "C", "k8s.io", "sigs.k8s.io"},
	"cmd/tandem":        {"k8s.io", "sigs.k8s.io"},
	// The engine's own packages take a hal.Backend; only the binary chooses the device.
	"node":   {"tandem/hal/vulkan"},
	"engine": {"tandem/hal/vulkan"},
	"model":  {"tandem/hal/vulkan"},
}

// testedWith lists, for packages only some tests may reach, the packages whose tests may
// import them: the Vulkan backend is held to the CPU's results in model's and node's tests
// and end to end in cmd/tandem's, nowhere else (the other packages' tests stay on hal/cpu).
var testedWith = map[string][]string{
	"tandem/hal/vulkan":          {"hal/vulkan", "internal/vulkantest", "model", "node", "cmd/tandem"},
	"tandem/internal/vulkantest": {"model", "node", "cmd/tandem"},
}

type listed struct {
	ImportPath   string
	Imports      []string
	Deps         []string
	TestImports  []string
	XTestImports []string
}

func goList(t *testing.T) []listed {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Deps,TestImports,XTestImports", "tandem/...")
	cmd.Env = append(cmd.Environ(), "CGO_ENABLED=0")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	var pkgs []listed
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func TestDependencyPolicy(t *testing.T) {
	for _, p := range goList(t) {
		name := strings.TrimPrefix(p.ImportPath, "tandem/")
		ok, known := allowed[name]
		if !known {
			t.Errorf("%s is not in the dependency policy (internal/deps): add it, with the packages it may import", p.ImportPath)
			continue
		}
		for _, imp := range p.Imports {
			switch {
			case strings.HasPrefix(imp, "tandem/"):
				if ok != nil && !slices.Contains(ok, strings.TrimPrefix(imp, "tandem/")) {
					t.Errorf("%s imports %s, which the policy does not allow", p.ImportPath, imp)
				}
			case strings.Contains(strings.SplitN(imp, "/", 2)[0], "."):
				if !thirdPartyAllowed(imp, name) {
					t.Errorf("%s imports %s: only %v may import it", p.ImportPath, imp, thirdPartyOwners(imp))
				}
			}
		}
		for _, imp := range append(append(slices.Clone(p.Imports), p.TestImports...), p.XTestImports...) {
			if who, ok := testedWith[imp]; ok && !slices.Contains(who, name) {
				t.Errorf("%s (or its tests) imports %s: only %v may", p.ImportPath, imp, who)
			}
		}
		for _, bad := range never[name] {
			for _, d := range append(p.Deps, p.Imports...) {
				if d == bad || strings.HasPrefix(d, bad+"/") {
					t.Errorf("%s links %s (through its imports), which it must never do", p.ImportPath, d)
					break
				}
			}
		}
	}
}

// thirdPartyOwners returns the policy's entry for the module imp belongs to.
func thirdPartyOwners(imp string) []string {
	for mod, who := range thirdParty {
		if imp == mod || strings.HasPrefix(imp, mod+"/") {
			return who
		}
	}
	return nil
}

func thirdPartyAllowed(imp, pkg string) bool {
	owners := thirdPartyOwners(imp)
	return owners != nil && slices.Contains(owners, pkg)
}
