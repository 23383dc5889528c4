package planner

import (
	"math"
	"testing"
)

func TestPredictors(t *testing.T) {
	ramp := func(i int) float64 { return 10 + 2*float64(i) }
	flat := func(int) float64 { return 7 }
	tests := []struct {
		name   string
		series func(int) float64
		h      int
		want   func(n, h int) float64 // the value h steps after the n observed
		tol    float64
	}{
		{"constant/flat", flat, 3, func(int, int) float64 { return 7 }, 0},
		{"constant/ramp", ramp, 1, func(n, h int) float64 { return ramp(n - 1) }, 0}, // the last value
		{"holt/flat", flat, 3, func(int, int) float64 { return 7 }, 1e-9},
		{"holt/ramp", ramp, 3, func(n, h int) float64 { return ramp(n-1) + 2*damped(h) }, 0.01},
		{"kalman/flat", flat, 3, func(int, int) float64 { return 7 }, 1e-6},
		{"kalman/ramp", ramp, 3, func(n, h int) float64 { return ramp(n-1) + 2*damped(h) }, 0.01},
	}
	for _, tc := range tests {
		name := tc.name[:len(tc.name)-len("/flat")]
		if tc.name[len(tc.name)-4:] == "ramp" {
			name = tc.name[:len(tc.name)-len("/ramp")]
		}
		p, err := NewPredictor(name)
		if err != nil {
			t.Fatal(err)
		}
		if p.Forecast(1) != 0 {
			t.Errorf("%s: forecast before any observation %v, want 0", tc.name, p.Forecast(1))
		}
		const n = 30
		for i := range n {
			p.Observe(tc.series(i))
		}
		got, want := p.Forecast(tc.h), tc.want(n, tc.h)
		if math.Abs(got-want) > tc.tol*want+1e-9 {
			t.Errorf("%s: forecast %d ahead %v, want %v", tc.name, tc.h, got, want)
		}
	}
	if _, err := NewPredictor("arima"); err == nil {
		t.Error("an unknown predictor was accepted")
	}
}

func TestPredictorsFollowAStep(t *testing.T) {
	// A rate that jumps 4× is followed within a few intervals, and none forecasts a
	// negative rate when it drops to 0.
	for _, name := range Predictors {
		p, _ := NewPredictor(name)
		for range 10 {
			p.Observe(1)
		}
		for range 4 {
			p.Observe(4)
		}
		if f := p.Forecast(1); f < 3.5 {
			t.Errorf("%s: four intervals after a step to 4, forecast %v", name, f)
		}
		if f := p.Forecast(3); f > 6 {
			t.Errorf("%s: a step to 4 taken for a lasting slope: forecast %v three intervals ahead", name, f)
		}
		for range 3 {
			p.Observe(0)
		}
		if f := p.Forecast(5); f < 0 {
			t.Errorf("%s: negative forecast %v", name, f)
		}
	}
}
