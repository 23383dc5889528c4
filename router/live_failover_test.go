package router

import (
	"testing"
	"time"
)

func TestDefaultHeartbeatTimeout(t *testing.T) {
	for _, c := range []struct{ interval, want time.Duration }{
		{50 * time.Millisecond, MinHeartbeatTimeout}, // the floor
		{250 * time.Millisecond, time.Second},        // tandem-router's default interval
		{500 * time.Millisecond, 2 * time.Second},    // four intervals
		{5 * time.Second, 20 * time.Second},
	} {
		if got := DefaultHeartbeatTimeout(c.interval); got != c.want {
			t.Errorf("DefaultHeartbeatTimeout(%v) = %v, want %v", c.interval, got, c.want)
		}
	}
}
