package benchreport

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's CPU times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// Usage is a process's peak resident memory so far and its CPU time (user
// and system), read from /proc.
type Usage struct {
	PeakRSSBytes int64
	// RSSBytes is the resident memory when read: what a process holds at
	// one moment, where the peak only ever grows.
	RSSBytes   int64
	CPUSeconds float64
	// FileRSSBytes is the file-backed part of the resident memory when
	// read: mostly the program's own code and data, which every process
	// pays once whatever it does.
	FileRSSBytes int64
}

// ReadUsage reads the usage of the running process pid.
func ReadUsage(pid int) (Usage, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return Usage{}, err
	}
	var u Usage
	for _, line := range strings.Split(string(status), "\n") {
		for field, dst := range map[string]*int64{"VmHWM:": &u.PeakRSSBytes, "VmRSS:": &u.RSSBytes, "RssFile:": &u.FileRSSBytes} {
			if rest, ok := strings.CutPrefix(line, field); ok {
				kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
				if err != nil {
					return Usage{}, fmt.Errorf("%s of %d: %w", field, pid, err)
				}
				*dst = kb << 10
			}
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Usage{}, err
	}
	// The command name (field 2) may hold spaces: count from its ')'.
	i := strings.LastIndexByte(string(stat), ')')
	fields := strings.Fields(string(stat)[i+1:])
	if len(fields) < 13 {
		return Usage{}, fmt.Errorf("/proc/%d/stat: %d fields after the name", pid, len(fields))
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(fields[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return Usage{}, fmt.Errorf("/proc/%d/stat: cannot parse CPU times", pid)
	}
	u.CPUSeconds = float64(utime+stime) / clockTicks
	return u, nil
}

// Add folds another incarnation's usage in: CPU adds up, the peak is the
// larger one, and the resident memory now is the later reading's (o).
func (u Usage) Add(o Usage) Usage {
	return Usage{PeakRSSBytes: max(u.PeakRSSBytes, o.PeakRSSBytes), CPUSeconds: u.CPUSeconds + o.CPUSeconds,
		RSSBytes: o.RSSBytes, FileRSSBytes: max(u.FileRSSBytes, o.FileRSSBytes)}
}
