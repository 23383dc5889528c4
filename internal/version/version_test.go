package version

import (
	"runtime/debug"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	for _, tc := range []struct {
		bi   debug.BuildInfo
		want string
	}{
		{debug.BuildInfo{Main: debug.Module{Version: "v1.2.0"}}, "v1.2.0"},
		{debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "devel"},
		{debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "5410a5b0123456789"}, {Key: "vcs.time", Value: "2026-11-30T19:40:00Z"}, {Key: "vcs.modified", Value: "true"}}},
			"devel 5410a5b (2026-11-30, modified)"},
		{debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc"}}}, "devel abc"},
	} {
		if got := fromBuildInfo(&tc.bi); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.bi, got, tc.want)
		}
	}
}
