package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// With an alias prefix every tandem: family is served twice, the same samples under both
// names; other families (the Go runtime's) once.
func TestAliased(t *testing.T) {
	reg := NewRegistry()
	e := NewEngine(reg, "m")
	e.Running.Set(3)
	e.TPOT.Observe(0.02)
	RegisterCacheConfig(reg, "m", map[string]string{"block_size": "16"})
	if Aliased(reg, "tandem", "") != prometheus.Gatherer(reg) || Aliased(reg, "tandem", "tandem") != prometheus.Gatherer(reg) {
		t.Error("no alias should be the registry itself")
	}
	mfs, err := Aliased(reg, "tandem", "vllm").Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]string{}
	for _, mf := range mfs {
		byName[mf.GetName()] = mf.String()
	}
	for _, name := range []string{"num_requests_running", "time_per_output_token_seconds", "gpu_cache_usage_perc", "request_inference_time_seconds", "cache_config_info"} {
		a, b := byName["tandem:"+name], byName["vllm:"+name]
		if a == "" || b == "" || strings.Replace(a, "tandem:", "vllm:", 1) != b {
			t.Errorf("%s: tandem %q, vllm %q", name, a, b)
		}
	}
	if !strings.Contains(byName["vllm:num_requests_running"], `value:"m"`) || !strings.Contains(byName["vllm:cache_config_info"], `value:"16"`) {
		t.Errorf("labels lost: %s / %s", byName["vllm:num_requests_running"], byName["vllm:cache_config_info"])
	}
	for name := range byName {
		if strings.HasPrefix(name, "vllm:go_") || strings.HasPrefix(name, "vllm:process_") {
			t.Errorf("%s: only tandem: families are aliased", name)
		}
	}
}
