package bench

import (
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// WritePlots writes SVG charts of r into dir (created if needed):
// ttft.svg, tpot.svg, itl.svg and e2el.svg (histogram with the CDF over
// it) and throughput.svg (output tokens/s and requests in flight over time).
// It returns the files' paths.
func WritePlots(dir string, r *Result) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	var ttft, tpot, itl, e2el []float64
	for i := range r.Requests {
		q := &r.Requests[i]
		if !q.OK() {
			continue
		}
		ttft = append(ttft, ms(q.TTFT))
		e2el = append(e2el, ms(q.E2E))
		if q.OutputLen > 1 {
			tpot = append(tpot, ms(q.TPOT()))
		}
		for _, d := range q.ITL {
			itl = append(itl, ms(d))
		}
	}
	var paths []string
	write := func(name string, f func(io.Writer) error) error {
		p := filepath.Join(dir, name)
		file, err := os.Create(p)
		if err != nil {
			return err
		}
		if err := f(file); err != nil {
			file.Close()
			return err
		}
		paths = append(paths, p)
		return file.Close()
	}
	for _, h := range []struct {
		file, title string
		v           []float64
	}{
		{"ttft.svg", "Time to first token", ttft},
		{"tpot.svg", "Time per output token (excl. 1st)", tpot},
		{"itl.svg", "Inter-token latency", itl},
		{"e2el.svg", "End-to-end latency", e2el},
	} {
		title := fmt.Sprintf("%s — %s, %s, %d values", h.title, r.Workload, r.Model, len(h.v))
		if err := write(h.file, func(w io.Writer) error { return HistogramSVG(w, title, "ms", h.v) }); err != nil {
			return paths, err
		}
	}
	bucket := time.Second
	if r.Summary.Duration > 200*time.Second {
		bucket = (r.Summary.Duration/200 + time.Second - 1).Truncate(time.Second)
	}
	pts := Timeseries(r.Requests, bucket)
	title := fmt.Sprintf("Throughput over time — %s, %s (%v buckets)", r.Workload, r.Model, bucket)
	err := write("throughput.svg", func(w io.Writer) error { return ThroughputSVG(w, title, pts) })
	return paths, err
}

const (
	svgW, svgH                 = 760, 420
	padL, padR, padT, padB     = 70, 70, 40, 50
	plotW, plotH               = svgW - padL - padR, svgH - padT - padB
	colBar, colLine, colSecond = "#8fb4d9", "#c0392b", "#27ae60"
)

type svg struct{ strings.Builder }

func (s *svg) open(title string) {
	fmt.Fprintf(s, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", svgW, svgH, svgW, svgH)
	fmt.Fprintf(s, `<rect width="%d" height="%d" fill="white"/>`+"\n", svgW, svgH)
	fmt.Fprintf(s, `<text x="%d" y="20" font-size="14" text-anchor="middle">%s</text>`+"\n", svgW/2, html.EscapeString(title))
	fmt.Fprintf(s, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#444"/>`+"\n", padL, padT, plotW, plotH)
}

func (s *svg) close(w io.Writer) error {
	s.WriteString("</svg>\n")
	_, err := io.WriteString(w, s.String())
	return err
}

// xAxis draws ticks for [lo, hi] and a label.
func (s *svg) xAxis(lo, hi float64, label string) {
	for _, t := range niceTicks(lo, hi, 8) {
		x := padL + (t-lo)/(hi-lo)*plotW
		fmt.Fprintf(s, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#444"/><text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n",
			x, padT+plotH, x, padT+plotH+5, x, padT+plotH+18, fmtTick(t))
	}
	fmt.Fprintf(s, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", padL+plotW/2, svgH-10, html.EscapeString(label))
}

// yAxis draws ticks for [0, hi] on the left or right side, in a colour.
func (s *svg) yAxis(hi float64, label, color string, right bool) {
	x, anchor, dx := padL, "end", -6
	if right {
		x, anchor, dx = padL+plotW, "start", 6
	}
	for _, t := range niceTicks(0, hi, 6) {
		y := padT + plotH - t/hi*plotH
		fmt.Fprintf(s, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#444"/><text x="%d" y="%.1f" text-anchor="%s" fill="%s">%s</text>`+"\n",
			x, y, x+dx/2, y, x+dx, y+4, anchor, color, fmtTick(t))
	}
	lx := 16
	if right {
		lx = svgW - 16
	}
	fmt.Fprintf(s, `<text x="%d" y="%d" text-anchor="middle" fill="%s" transform="rotate(-90 %d %d)">%s</text>`+"\n",
		lx, padT+plotH/2, color, lx, padT+plotH/2, html.EscapeString(label))
}

func (s *svg) polyline(xs, ys []float64, color string) {
	var b strings.Builder
	for i := range xs {
		fmt.Fprintf(&b, "%.1f,%.1f ", xs[i], ys[i])
	}
	fmt.Fprintf(s, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.8"/>`+"\n", strings.TrimSpace(b.String()), color)
}

// HistogramSVG draws a histogram of values (left axis: count) with their
// empirical CDF over it (right axis: fraction).
func HistogramSVG(w io.Writer, title, unit string, values []float64) error {
	var s svg
	s.open(title)
	if len(values) == 0 {
		fmt.Fprintf(&s, `<text x="%d" y="%d" text-anchor="middle">no data</text>`+"\n", svgW/2, svgH/2)
		return s.close(w)
	}
	sorted := slices.Clone(values)
	slices.Sort(sorted)
	lo, hi := sorted[0], sorted[len(sorted)-1]
	if lo > 0 && lo < hi/4 {
		lo = 0
	}
	if hi <= lo {
		hi = lo + 1
	}
	const bins = 40
	counts := make([]int, bins)
	for _, v := range sorted {
		counts[min(int((v-lo)/(hi-lo)*bins), bins-1)]++
	}
	top := float64(slices.Max(counts))
	bw := float64(plotW) / bins
	for i, c := range counts {
		h := float64(c) / top * plotH
		fmt.Fprintf(&s, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"/>`+"\n",
			padL+float64(i)*bw, padT+plotH-h, bw-1, h, colBar)
	}
	xs, ys := make([]float64, 0, len(sorted)+1), make([]float64, 0, len(sorted)+1)
	step := max(len(sorted)/500, 1) // at most ~500 points
	xs, ys = append(xs, padL), append(ys, padT+plotH)
	for i := 0; i < len(sorted); i += step {
		xs = append(xs, padL+(sorted[i]-lo)/(hi-lo)*plotW)
		ys = append(ys, padT+plotH-float64(i+1)/float64(len(sorted))*plotH)
	}
	xs, ys = append(xs, padL+plotW), append(ys, padT)
	s.polyline(xs, ys, colLine)
	s.xAxis(lo, hi, unit)
	s.yAxis(top, "count", "#1f4e79", false)
	s.yAxis(1, "CDF", colLine, true)
	return s.close(w)
}

// ThroughputSVG draws output tokens per second (left axis) and requests in
// flight (right axis) over time.
func ThroughputSVG(w io.Writer, title string, pts []Point) error {
	var s svg
	s.open(title)
	if len(pts) == 0 {
		fmt.Fprintf(&s, `<text x="%d" y="%d" text-anchor="middle">no data</text>`+"\n", svgW/2, svgH/2)
		return s.close(w)
	}
	bucket := time.Second
	if len(pts) > 1 {
		bucket = pts[1].T - pts[0].T
	}
	end := (pts[len(pts)-1].T + bucket).Seconds()
	topTok, topIn := 1.0, 1.0
	for _, p := range pts {
		topTok = max(topTok, p.OutputTokens)
		topIn = max(topIn, p.InFlight)
	}
	topTok, topIn = topTok*1.05, topIn*1.05 // keep the lines off the frame
	xs, tok, in := make([]float64, 0, 2*len(pts)), make([]float64, 0, 2*len(pts)), make([]float64, 0, 2*len(pts))
	for _, p := range pts { // steps: each bucket is flat
		for _, t := range []float64{p.T.Seconds(), (p.T + bucket).Seconds()} {
			xs = append(xs, padL+t/end*plotW)
			tok = append(tok, padT+plotH-p.OutputTokens/topTok*plotH)
			in = append(in, padT+plotH-p.InFlight/topIn*plotH)
		}
	}
	s.polyline(xs, tok, "#1f4e79")
	s.polyline(xs, in, colSecond)
	s.xAxis(0, end, "time since start (s)")
	s.yAxis(topTok, "output tokens/s", "#1f4e79", false)
	s.yAxis(topIn, "requests in flight (mean)", colSecond, true)
	return s.close(w)
}

// niceTicks returns about n round tick values in [lo, hi].
func niceTicks(lo, hi float64, n int) []float64 {
	if !(hi > lo) || n < 1 {
		return []float64{lo}
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	for t := math.Ceil(lo/step) * step; t <= hi+step*1e-9; t += step {
		out = append(out, t)
	}
	return out
}

func fmtTick(v float64) string {
	if v != 0 && (math.Abs(v) >= 1e6 || math.Abs(v) < 1e-3) {
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
	return strconv.FormatFloat(math.Round(v*1000)/1000, 'f', -1, 64)
}
