package live

import (
	"testing"
	"time"

	"tandem/cluster"
	"tandem/router"
)

func TestDefaultHeartbeatTimeout(t *testing.T) {
	for _, c := range []struct{ interval, want time.Duration }{
		{50 * time.Millisecond, MinHeartbeatTimeout}, // the floor
		{250 * time.Millisecond, 2 * time.Second},    // tandem-router's default interval
		{500 * time.Millisecond, 4 * time.Second},    // eight intervals
		{5 * time.Second, 40 * time.Second},
	} {
		if got := DefaultHeartbeatTimeout(c.interval); got != c.want {
			t.Errorf("DefaultHeartbeatTimeout(%v) = %v, want %v", c.interval, got, c.want)
		}
	}
}

// The policy core names the roles itself, to link no wire code: they must be the card's.
func TestRolesMatchTheCard(t *testing.T) {
	for core, card := range map[string]string{router.RoleBoth: cluster.RoleBoth, router.RolePrefill: cluster.RolePrefill, router.RoleDecode: cluster.RoleDecode} {
		if core != card {
			t.Errorf("router's role %q is the card's %q", core, card)
		}
	}
}
