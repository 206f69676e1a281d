// Package version reports the build of the running ferry binary.
package version

import (
	"runtime/debug"
)

// String is the main module's version and, when built from a git checkout,
// the commit (with "-dirty" for uncommitted changes).
func String() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := info.Main.Version
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "-dirty"
			}
		}
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		return v + "+" + rev + dirty
	}
	return v
}
