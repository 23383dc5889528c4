package web

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"

	"tandem/sla"
)

// Snapshot is one data event of the stream: the process's metric families at a moment,
// as /metrics would show them (cumulative counters, gauges, cumulative histogram
// buckets). The page keeps a history of them and derives rates, ratios and windowed
// percentiles itself, so every figure it shows follows from values /metrics also serves.
type Snapshot struct {
	Time    int64              `json:"t"` // Unix milliseconds
	Kind    Kind               `json:"kind"`
	Name    string             `json:"name,omitempty"`
	SLA     SLA                `json:"sla"`
	Period  float64            `json:"period_s"` // seconds between snapshots
	Metrics map[string]*Family `json:"metrics"`
	Error   string             `json:"error,omitempty"` // the registry's gather error, if any
}

// SLA is sla.Targets in seconds.
type SLA struct {
	TTFT float64 `json:"ttft_s"`
	ITL  float64 `json:"itl_s"`
}

// Family is one metric family: its type (counter, gauge or histogram), its label names,
// a histogram's bucket upper bounds (+Inf implied), and its series.
type Family struct {
	Type   string   `json:"type"`
	Labels []string `json:"labels"`
	Bounds []Number `json:"le,omitempty"`
	Series []Series `json:"series"`
}

// Series is one labelled series: its label values (in the family's Labels order) and its
// value, which for a histogram is its count, with its sum and cumulative bucket counts.
type Series struct {
	Labels  []string `json:"l"`
	Value   Number   `json:"v"`
	Sum     Number   `json:"sum,omitzero"`
	Buckets []Number `json:"b,omitempty"`
}

// Number is a float64 whose JSON is null when it is not finite (JSON has no NaN or Inf).
type Number float64

// MarshalJSON implements json.Marshaler.
func (n Number) MarshalJSON() ([]byte, error) {
	f := float64(n)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, f, 'g', -1, 64), nil
}

// UnmarshalJSON implements json.Unmarshaler: null reads as NaN.
func (n *Number) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*n = Number(math.NaN())
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	*n = Number(f)
	return err
}

// processFamilies are the process collector's families a dashboard shows besides its
// kind's own.
var processFamilies = []string{"process_cpu_seconds_total", "process_resident_memory_bytes", "process_start_time_seconds"}

// Build makes the snapshot of kind's metric families among fams (those named kind's
// prefix and a colon, and processFamilies) at now. Summaries and families of other
// types are left out: no panel draws them.
func Build(kind Kind, name string, targets sla.Targets, period time.Duration, fams []*dto.MetricFamily, now time.Time) Snapshot {
	s := Snapshot{
		Time: now.UnixMilli(), Kind: kind, Name: name, Period: period.Seconds(),
		SLA:     SLA{TTFT: targets.TTFT.Seconds(), ITL: targets.ITL.Seconds()},
		Metrics: map[string]*Family{},
	}
	prefix := kind.prefix() + ":"
	for _, mf := range fams {
		n := mf.GetName()
		if !strings.HasPrefix(n, prefix) && !slices.Contains(processFamilies, n) {
			continue
		}
		if f := family(mf); f != nil {
			s.Metrics[n] = f
		}
	}
	return s
}

// family converts one metric family, or returns nil for a type the dashboard does not draw.
func family(mf *dto.MetricFamily) *Family {
	f := &Family{Labels: []string{}, Series: make([]Series, 0, len(mf.GetMetric()))}
	switch mf.GetType() {
	case dto.MetricType_COUNTER:
		f.Type = "counter"
	case dto.MetricType_GAUGE, dto.MetricType_UNTYPED:
		f.Type = "gauge"
	case dto.MetricType_HISTOGRAM:
		f.Type = "histogram"
	default:
		return nil
	}
	// Label names: the union over the series, sorted (client_golang gives every series of
	// a family the same names; a missing one reads as "", as in PromQL).
	for _, m := range mf.GetMetric() {
		for _, lp := range m.GetLabel() {
			if !slices.Contains(f.Labels, lp.GetName()) {
				f.Labels = append(f.Labels, lp.GetName())
			}
		}
	}
	slices.Sort(f.Labels)
	for _, m := range mf.GetMetric() {
		se := Series{Labels: make([]string, len(f.Labels))}
		for _, lp := range m.GetLabel() {
			se.Labels[slices.Index(f.Labels, lp.GetName())] = lp.GetValue()
		}
		switch f.Type {
		case "counter":
			se.Value = Number(m.GetCounter().GetValue())
		case "gauge":
			if g := m.GetGauge(); g != nil {
				se.Value = Number(g.GetValue())
			} else {
				se.Value = Number(m.GetUntyped().GetValue())
			}
		case "histogram":
			h := m.GetHistogram()
			se.Value, se.Sum = Number(h.GetSampleCount()), Number(h.GetSampleSum())
			bs := h.GetBucket()
			if f.Bounds == nil {
				f.Bounds = make([]Number, 0, len(bs))
				for _, b := range bs {
					if !math.IsInf(b.GetUpperBound(), +1) {
						f.Bounds = append(f.Bounds, Number(b.GetUpperBound()))
					}
				}
			}
			se.Buckets = make([]Number, len(f.Bounds))
			for i, b := range bs {
				if i < len(se.Buckets) {
					se.Buckets[i] = Number(b.GetCumulativeCount())
				}
			}
		}
		f.Series = append(f.Series, se)
	}
	return f
}
