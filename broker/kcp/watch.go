package kcp

import (
	"context"
	"slices"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"

	"github.com/ferry-dev/ferry/broker/config"
)

// WatchVirtualWorkspace calls onChange with the virtual workspace URLs of
// ref's APIExportEndpointSlice (every endpoint: one per shard; rewritten,
// sorted, without duplicates; empty while there is none) each time they
// change, until ctx ends. One watch of the workspace's slices serves every
// export of the workspace (sliceWatches), so the broker learns about a
// shard's endpoint as soon as kcp publishes it, without polling. onChange
// is called from one goroutine at a time.
func (r *Resolver) WatchVirtualWorkspace(ctx context.Context, ref config.APIExportRef, onChange func(VirtualWorkspace)) {
	r.slices.watch(ctx, ref.Workspace, ref.Name, onChange)
}

// endpointReporter turns observations of an APIExportEndpointSlice into
// reports of its endpoint URLs: the first observation, then each change
// of the set.
type endpointReporter struct {
	// export names the export whose slice is observed: another slice
	// under its name is no slice ("" checks nothing).
	export   string
	rewrite  EndpointRewrite
	onChange func(VirtualWorkspace)
	last     VirtualWorkspace
	reported bool
}

// VirtualWorkspace is what an APIExport's endpoint slice says of its
// virtual workspace.
type VirtualWorkspace struct {
	// Exists tells whether the slice exists. kcp makes one for every
	// APIExport and deletes it with the export, so an existing slice also
	// says the export is there.
	Exists bool
	// URLs are the endpoints (one per shard serving bound workspaces),
	// rewritten (EndpointRewrite), sorted; none until a workspace binds
	// the export.
	URLs []string
}

func newEndpointReporter(rewrite EndpointRewrite, onChange func(VirtualWorkspace)) *endpointReporter {
	return &endpointReporter{rewrite: rewrite, onChange: onChange}
}

// observe takes the slice as now seen (anything else, e.g. nil after a
// deletion, is no slice: no endpoints).
func (e *endpointReporter) observe(obj any) {
	s, _ := obj.(*apisv1alpha1.APIExportEndpointSlice)
	if s != nil && e.export != "" && !isSliceOf(s, e.export) {
		s = nil
	}
	vw := VirtualWorkspace{Exists: s != nil, URLs: endpointURLs(s, e.rewrite)}
	if e.reported && vw.Exists == e.last.Exists && slices.Equal(vw.URLs, e.last.URLs) {
		return
	}
	e.last, e.reported = vw, true
	e.onChange(vw)
}
