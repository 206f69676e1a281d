package framework

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// childWithArg returns the pid of the one child process of parent whose
// command line has arg as one of its arguments, read from /proc.
func childWithArg(parent int, arg string) (int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var found []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue // not a process
		}
		ppid, err := parentPid(pid)
		if err != nil || ppid != parent {
			continue // gone meanwhile, or another's child
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		for _, a := range bytes.Split(cmdline, []byte{0}) {
			if string(a) == arg {
				found = append(found, pid)
				break
			}
		}
	}
	switch len(found) {
	case 0:
		return 0, fmt.Errorf("process %d has no child with argument %q", parent, arg)
	case 1:
		return found[0], nil
	default:
		return 0, fmt.Errorf("process %d has %d children with argument %q: %v", parent, len(found), arg, found)
	}
}

// parentPid reads pid's parent from /proc/<pid>/status.
func parentPid(pid int) (int, error) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no PPid", pid)
}
