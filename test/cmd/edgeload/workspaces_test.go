package main

import (
	"fmt"
	"testing"

	"github.com/kcp-dev/logicalcluster/v3"
)

// TestWorkspaceSpread checks which export lands in which workspace: round
// robin, every workspace used when there are at least as many exports, and
// no workspace holding more than one export beyond another.
func TestWorkspaceSpread(t *testing.T) {
	for _, tc := range []struct {
		n, w int
		want []int // workspace of export 0..n-1
	}{
		{n: 3, w: 1, want: []int{0, 0, 0}},
		{n: 5, w: 2, want: []int{0, 1, 0, 1, 0}},
		{n: 7, w: 3, want: []int{0, 1, 2, 0, 1, 2, 0}},
		{n: 4, w: 4, want: []int{0, 1, 2, 3}},
	} {
		t.Run(fmt.Sprintf("%dx%d", tc.n, tc.w), func(t *testing.T) {
			var paths []logicalcluster.Path
			for j := range tc.w {
				paths = append(paths, logicalcluster.NewPath("root").Join(workspaceName(j, tc.w)))
			}
			l := layout{workspaces: paths}
			counts := make([]int, tc.w)
			byEdge := l.edgeWorkspaces(tc.n)
			for i := range tc.n {
				if got := workspaceIndex(i, tc.w); got != tc.want[i] {
					t.Errorf("export %d in workspace %d; want %d", i, got, tc.want[i])
				}
				if got, want := l.exportWorkspace(i), paths[tc.want[i]]; got != want {
					t.Errorf("export %d in %s; want %s", i, got, want)
				}
				if got := byEdge[edgeName(i)]; got != paths[tc.want[i]] {
					t.Errorf("edge %s looked up in %s; want %s", edgeName(i), got, paths[tc.want[i]])
				}
				counts[tc.want[i]]++
			}
			lo, hi := counts[0], counts[0]
			for _, c := range counts {
				lo, hi = min(lo, c), max(hi, c)
			}
			if lo == 0 || hi-lo > 1 {
				t.Errorf("exports per workspace %v: want every workspace used, within one of each other", counts)
			}
			if len(byEdge) != tc.n {
				t.Errorf("%d edges looked up; want %d", len(byEdge), tc.n)
			}
		})
	}
}

// TestWorkspaceNames checks that one workspace keeps today's name and
// several get distinct names that cannot collide with the consumer's.
func TestWorkspaceNames(t *testing.T) {
	if got := workspaceName(0, 1); got != "edgeload" {
		t.Errorf("the one workspace is %q; want edgeload", got)
	}
	seen := map[string]bool{consumerWorkspace: true}
	for j := range 200 {
		name := workspaceName(j, 200)
		if seen[name] {
			t.Fatalf("workspace %d named %q twice (or like the consumer)", j, name)
		}
		seen[name] = true
	}
}
