package metrics

import (
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// Dashboards users already have: vLLM's stock Grafana dashboard reads vllm:NAME series
// with a model_name label. Tandem's metrics carry vLLM's names under its own prefix
// (tandem:, tandem_router:), which its dashboards (web, deploy/grafana) read; with an
// alias prefix (--metrics-prefix vllm) /metrics serves every such series a second time
// under that prefix, so both kinds of dashboard work at once.

// MetricsPrefixes are the alias prefixes --metrics-prefix accepts ("" or "tandem": none).
var MetricsPrefixes = []string{"tandem", "vllm"}

// Aliased returns a gatherer of reg that also serves each family named from:NAME as
// alias:NAME (from "tandem" or "tandem_router"); alias "" or from returns reg itself.
func Aliased(reg prometheus.Gatherer, from, alias string) prometheus.Gatherer {
	if alias == "" || alias == "tandem" || alias == from {
		return reg
	}
	prefix := from + ":"
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		mfs, err := reg.Gather()
		out := make([]*dto.MetricFamily, 0, 2*len(mfs))
		for _, mf := range mfs {
			out = append(out, mf)
			if name := mf.GetName(); strings.HasPrefix(name, prefix) {
				aliasName := alias + ":" + strings.TrimPrefix(name, prefix)
				out = append(out, &dto.MetricFamily{Name: &aliasName, Help: mf.Help, Type: mf.Type, Unit: mf.Unit, Metric: mf.Metric})
			}
		}
		slices.SortFunc(out, func(a, b *dto.MetricFamily) int { return strings.Compare(a.GetName(), b.GetName()) })
		return out, err
	})
}

// HandlerFor serves g in the Prometheus text format.
func HandlerFor(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{})
}

// RegisterCacheConfig registers vLLM's cache_config_info: a gauge of 1 whose labels
// describe the KV cache (block_size, num_gpu_blocks, cache_dtype, …).
func RegisterCacheConfig(reg prometheus.Registerer, model string, labels map[string]string) {
	all := prometheus.Labels{"model_name": model}
	for k, v := range labels {
		all[k] = v
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "tandem:cache_config_info", Help: "Information of the KV cache configuration (vLLM's cache_config_info).", ConstLabels: all})
	g.Set(1)
	reg.MustRegister(g)
}

var nBuckets = []float64{1, 2, 5, 10, 20}
