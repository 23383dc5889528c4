package metrics

import "github.com/prometheus/client_golang/prometheus"

// DeviceCounters is what a device backend (hal/vulkan) reports, read at scrape time: the
// weight matrices it converted at load for want of a kernel of their type, by conversion
// ("q4_0→f32"), and the forward steps it recorded into command buffers, replayed, and
// whose records it dropped (their buffers changed).
type DeviceCounters struct {
	Converted func() map[string]int
	Steps     func() (captures, replays, drops int64)
}

// RegisterDevice registers a device backend's metrics for model on reg.
func RegisterDevice(reg prometheus.Registerer, model string, d DeviceCounters) {
	labels := prometheus.Labels{"model_name": model}
	step := func(i int) func() float64 {
		return func() float64 {
			c, r, x := d.Steps()
			return float64([3]int64{c, r, x}[i])
		}
	}
	reg.MustRegister(
		&convertedCollector{
			desc: prometheus.NewDesc("tandem:device_weights_converted",
				"Weight matrices the device converted at load (dequantized to F32: no kernel of their type), by conversion.", []string{"conversion"}, labels),
			f: d.Converted,
		},
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tandem:device_step_captures_total",
			Help: "Forward steps recorded into a command buffer and kept for replay (one per step shape).", ConstLabels: labels}, step(0)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tandem:device_step_replays_total",
			Help: "Forward steps run by replaying a recorded command buffer with new inputs.", ConstLabels: labels}, step(1)),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tandem:device_step_capture_drops_total",
			Help: "Recorded steps dropped because the buffers they read changed, or to bound their number.", ConstLabels: labels}, step(2)),
	)
}

type convertedCollector struct {
	desc *prometheus.Desc
	f    func() map[string]int
}

func (c *convertedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *convertedCollector) Collect(ch chan<- prometheus.Metric) {
	for conv, n := range c.f() {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), conv)
	}
}
