package main

import (
	"context"
	"fmt"

	"github.com/kcp-dev/logicalcluster/v3"
	"k8s.io/client-go/rest"
)

// workspacesParallel is how many workspaces the generator creates at
// once: kcp schedules and initializes each, which takes it far longer
// than the request, so a few in flight keep it busy without piling up.
const workspacesParallel = 16

// workspaceIndex is the workspace (0..w-1) holding simulated edge i's
// APIExport: the exports are dealt round-robin, so with w <= n every
// workspace holds n/w or n/w+1 of them.
func workspaceIndex(i, w int) int { return i % w }

// workspaceName is the name, under root, of workspace j of w: one
// workspace keeps its old name, edgeload, so a run with the default
// --workspaces=1 reads the same as before the flag.
func workspaceName(j, w int) string {
	if w == 1 {
		return "edgeload"
	}
	return fmt.Sprintf("edgeload-%03d", j)
}

// layout is where the simulated edges' APIExports live.
type layout struct {
	workspaces []logicalcluster.Path
}

// exportWorkspace is the workspace of simulated edge i's APIExport.
func (l layout) exportWorkspace(i int) logicalcluster.Path {
	return l.workspaces[workspaceIndex(i, len(l.workspaces))]
}

// edgeWorkspaces maps the first n simulated edges' names to their
// exports' workspaces (the traffic edges are looked up by name).
func (l layout) edgeWorkspaces(n int) map[string]logicalcluster.Path {
	m := make(map[string]logicalcluster.Path, n)
	for i := range n {
		m[edgeName(i)] = l.exportWorkspace(i)
	}
	return m
}

// createWorkspaces creates the w workspaces under root, parallel at once,
// and waits until each is ready.
func createWorkspaces(ctx context.Context, cfg *rest.Config, w, parallel int) (layout, error) {
	l := layout{workspaces: make([]logicalcluster.Path, w)}
	err := forEach(ctx, w, parallel, func(j int) error {
		path, err := createWorkspace(ctx, cfg, workspaceName(j, w))
		if err != nil {
			return err
		}
		l.workspaces[j] = path
		return nil
	})
	return l, err
}
