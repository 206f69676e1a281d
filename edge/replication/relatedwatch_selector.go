package replication

import (
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// The label selector of a related kind's informers (watch.labelSelector).
//
// One informer per namespace (or one for the cluster) serves every related
// entry of a resource, of every PublishedResource. It lists and watches
// with a label selector only when every such entry is service-origin and
// sets the same watch.labelSelector: then no entry can find an object the
// selector leaves out, and the API server sends only what is needed. As
// soon as one entry of the resource needs more — no watch, another
// selector, or origin kcp, whose copies carry ferry's labels and must be
// seen whatever they carry to never overwrite a stranger's object — the
// informers cache every object of the kind (in the namespaces the edge may
// use), and each entry's own selector is applied when it looks an object
// up (Reference.Watches). So an entry finds the same objects whatever
// other entries share its informers; only the memory differs. One informer
// per (resource, selector) would cache objects matched by several
// selectors twice and multiply the watches; the common case — one service
// owner, one controller's label — needs one.

// relatedInformerSelectors returns, for every related resource the
// registered PublishedResources use, the label selector its informers
// list and watch with ("" for every object).
func relatedInformerSelectors(published map[string]*Published) map[schema.GroupVersionResource]string {
	out := map[schema.GroupVersionResource]string{}
	narrow := map[schema.GroupVersionResource]bool{}
	for _, p := range published {
		for i := range p.Related {
			r := &p.Related[i]
			sel := ""
			if r.Origin == ferryv1alpha1.OriginService {
				sel = r.WatchSelector()
			}
			prev, seen := out[r.Local]
			switch {
			case !seen:
				out[r.Local], narrow[r.Local] = sel, sel != ""
			case prev != sel:
				narrow[r.Local] = false
			}
		}
	}
	for gvr, ok := range narrow {
		if !ok {
			out[gvr] = ""
		}
	}
	return out
}
