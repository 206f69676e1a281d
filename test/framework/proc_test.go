package framework

import (
	"os"
	"os/exec"
	"slices"
	"testing"
)

func TestChildWithArg(t *testing.T) {
	start := func(args ...string) *exec.Cmd {
		cmd := exec.Command("sleep", args...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd
	}
	one := start("301")
	start("302")
	start("302")

	pid, err := childWithArg(os.Getpid(), "301")
	if err != nil || pid != one.Process.Pid {
		t.Errorf("childWithArg(301) = %d, %v; want %d", pid, err, one.Process.Pid)
	}
	// Arguments match whole, not as substrings.
	if pid, err := childWithArg(os.Getpid(), "30"); err == nil {
		t.Errorf("childWithArg(30) found %d, want an error", pid)
	}
	if _, err := childWithArg(os.Getpid(), "302"); err == nil {
		t.Error("childWithArg(302) with two such children found one, want an error")
	}
	// Only children count: this process's parent has no child "301".
	if pid, err := childWithArg(os.Getppid(), "301"); err == nil {
		t.Errorf("childWithArg of the parent found %d, want an error", pid)
	}
}

func TestShardedFixedPorts(t *testing.T) {
	got := shardedFixedPorts(2)
	want := []int{6443, 8010, 8011, 8012, 6444, 2379, 2380, 6445, 2381, 2382}
	if !slices.Equal(got, want) {
		t.Errorf("shardedFixedPorts(2) = %v, want %v", got, want)
	}
}
