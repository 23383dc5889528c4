package live

import (
	"testing"

	"tandem/llm"
)

// The stream interval asked of a worker: the configured one for a streamed answer, the
// collected one (unless the configured one is larger) for an answer read only whole.
func TestStreamIntervalFor(t *testing.T) {
	for _, tc := range []struct {
		stream, collected int
		isCollected       bool
		want              int
	}{
		{1, 64, false, 1},
		{1, 64, true, 64},
		{16, 64, false, 16},
		{128, 64, true, 128},
		{1, 1, true, 1},
	} {
		cfg := Config{StreamInterval: tc.stream, CollectedInterval: tc.collected}
		if got := cfg.streamInterval(&llm.Request{Collected: tc.isCollected}); got != tc.want {
			t.Errorf("stream interval %d, collected %d, request collected %v: asked %d, want %d",
				tc.stream, tc.collected, tc.isCollected, got, tc.want)
		}
	}
}
