// Package version names the running build: the module's version when built from a tagged
// module, else the VCS revision and commit time the go command stamps into the binary.
package version

import (
	"runtime/debug"
	"strings"
)

// String returns the build's version, such as "v1.2.0" or "devel 5410a5b (2026-11-30,
// modified)"; "devel" alone when the binary carries no build information (go run of
// files, tests).
func String() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	return fromBuildInfo(bi)
}

func fromBuildInfo(bi *debug.BuildInfo) string {
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev, when string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			when, _, _ = strings.Cut(s.Value, "T")
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if rev == "" {
		return "devel"
	}
	if len(rev) > 7 {
		rev = rev[:7]
	}
	var extra []string
	if when != "" {
		extra = append(extra, when)
	}
	if modified {
		extra = append(extra, "modified")
	}
	if len(extra) == 0 {
		return "devel " + rev
	}
	return "devel " + rev + " (" + strings.Join(extra, ", ") + ")"
}
