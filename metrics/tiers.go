package metrics

import "github.com/prometheus/client_golang/prometheus"

// KVTiers holds an engine's metrics of the KV cache's tiers (docs/kv-tiers.md): the figures
// read at scrape time from the pool's books and the stores (RegisterKVTiers), and the
// onboarding latency the engine observes.
type KVTiers struct {
	// OnboardSeconds is the time a sequence waited for its blocks to load from lower tiers.
	OnboardSeconds prometheus.Observer
}

// TierFigures is one tier's figures at a scrape.
type TierFigures struct {
	Tier     string // device, host, disk, remote
	Blocks   int    // blocks holding KV (device: in use or cached; lower tiers: ready)
	Capacity int    // blocks (0: unbounded)
	// Counters: blocks found here by a prompt (device: prefix-cache hits; lower tiers:
	// blocks onboarded from here), blocks and bytes that entered the tier from the one
	// above, blocks and bytes loaded from it into the device, evictions, blocks not stored
	// (the tier full of pinned blocks, or its queue at its bound), copies into it that
	// failed.
	Hits, Offloaded, OffloadedBytes, Onboarded, OnboardedBytes, Evictions, Skipped, Failed uint64
	LoadMicros                                                                             int // measured µs to load one block from this tier into the device (0: not yet)
	// Bypassed counts prompts that found their next block here but computed it, the tier
	// measuring slower than computing (Loadable false while it does).
	Bypassed uint64
	Loadable bool
}

// TierFault is a count of one kind of store error of a tier.
type TierFault struct {
	Tier, Op, Kind string
	Count          uint64
}

// TierSnapshot is what RegisterKVTiers reads at each scrape.
type TierSnapshot struct {
	Tiers  []TierFigures
	Faults []TierFault
}

// NewKVTiers registers an engine's tier metrics for model on reg; snap is read at each
// scrape.
func NewKVTiers(reg prometheus.Registerer, model string, snap func() TierSnapshot) *KVTiers {
	labels := prometheus.Labels{"model_name": model}
	f := factory{reg: reg, labels: labels}
	reg.MustRegister(&tierCollector{snap: snap, d: newTierDescs(labels)})
	return &KVTiers{
		OnboardSeconds: f.histogram("tandem:kv_onboard_seconds",
			"Time a sequence waited for its prompt's blocks to load from lower KV tiers (host memory, disk, shared directory).", latencyBuckets),
	}
}

// tierDescs are the tier collector's metric descriptions, with the model's label.
type tierDescs struct {
	blocks, capacity, hits, off, offB, on, onB, evict, skip, fail, load, crc, err, bypass, loadable *prometheus.Desc
}

func newTierDescs(labels prometheus.Labels) tierDescs {
	tier := []string{"tier"}
	d := func(name, help string, l []string) *prometheus.Desc { return prometheus.NewDesc(name, help, l, labels) }
	return tierDescs{
		blocks:   d("tandem:kv_tier_blocks", "KV blocks held in the tier (device: in use or cached).", tier),
		capacity: d("tandem:kv_tier_capacity_blocks", "Capacity of the tier in KV blocks (0: unbounded).", tier),
		hits:     d("tandem:kv_tier_hits_total", "Prompt blocks found in the tier (device: prefix-cache hits; lower tiers: blocks onboarded from it).", tier),
		off:      d("tandem:kv_tier_offloaded_blocks_total", "KV blocks that entered the tier from the tier above.", tier),
		offB:     d("tandem:kv_tier_offloaded_bytes_total", "Bytes of the KV blocks that entered the tier from the tier above.", tier),
		on:       d("tandem:kv_tier_onboarded_blocks_total", "KV blocks loaded from the tier into the device.", tier),
		onB:      d("tandem:kv_tier_onboarded_bytes_total", "Bytes of the KV blocks loaded from the tier into the device.", tier),
		evict:    d("tandem:kv_tier_evictions_total", "KV blocks evicted from the tier to make room.", tier),
		skip:     d("tandem:kv_tier_skipped_total", "KV blocks not stored in the tier: every block pinned, or its write queue at its bound.", tier),
		fail:     d("tandem:kv_tier_store_failures_total", "Copies of KV blocks into the tier that failed (the block was not stored).", tier),
		load:     d("tandem:kv_tier_load_seconds_per_block", "Measured time to load one KV block from the tier into the device (moving average; 0 until measured).", tier),
		crc:      d("tandem:kv_tier_checksum_failures_total", "KV blocks read from the tier that failed their checksum (dropped and recomputed).", tier),
		bypass:   d("tandem:kv_tier_bypassed_total", "Prompts that found their next KV block in the tier but computed it, since loading from the tier measured slower than computing.", tier),
		loadable: d("tandem:kv_tier_loadable", "1 while prompts load KV blocks from the tier; 0 while they compute them instead (the tier measured slower than computing; tried again each minute).", tier),
		err: d("tandem:kv_tier_errors_total", "Errors of the tier's store, by operation (read, write, open, scan: what the start-up scan found unusable, onboard: the device refused a loaded block) and kind (corrupt, mismatch, missing, full, gone, io, foreign, beyond_size, temp, direct_refused, device_refused); the block is recomputed.",
			[]string{"tier", "op", "kind"}),
	}
}

type tierCollector struct {
	snap func() TierSnapshot
	d    tierDescs
}

func (c *tierCollector) Describe(ch chan<- *prometheus.Desc) {
	d := &c.d
	for _, x := range []*prometheus.Desc{d.blocks, d.capacity, d.hits, d.off, d.offB, d.on, d.onB, d.evict, d.skip, d.fail, d.load, d.crc, d.err, d.bypass, d.loadable} {
		ch <- x
	}
}

func (c *tierCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.snap()
	d := &c.d
	gauge := func(x *prometheus.Desc, v float64, l ...string) {
		ch <- prometheus.MustNewConstMetric(x, prometheus.GaugeValue, v, l...)
	}
	counter := func(x *prometheus.Desc, v uint64, l ...string) {
		ch <- prometheus.MustNewConstMetric(x, prometheus.CounterValue, float64(v), l...)
	}
	crc := map[string]uint64{}
	for _, f := range s.Faults {
		counter(d.err, f.Count, f.Tier, f.Op, f.Kind)
		if f.Kind == "corrupt" && f.Op == "read" {
			crc[f.Tier] += f.Count
		}
	}
	for _, t := range s.Tiers {
		gauge(d.blocks, float64(t.Blocks), t.Tier)
		gauge(d.capacity, float64(t.Capacity), t.Tier)
		counter(d.hits, t.Hits, t.Tier)
		counter(d.off, t.Offloaded, t.Tier)
		counter(d.offB, t.OffloadedBytes, t.Tier)
		counter(d.on, t.Onboarded, t.Tier)
		counter(d.onB, t.OnboardedBytes, t.Tier)
		counter(d.evict, t.Evictions, t.Tier)
		counter(d.skip, t.Skipped, t.Tier)
		counter(d.fail, t.Failed, t.Tier)
		gauge(d.load, float64(t.LoadMicros)/1e6, t.Tier)
		counter(d.crc, crc[t.Tier], t.Tier)
		counter(d.bypass, t.Bypassed, t.Tier)
		gauge(d.loadable, boolGauge(t.Loadable), t.Tier)
	}
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
