package replication

import (
	"fmt"

	"github.com/ferry-dev/ferry/pkg/related"
)

// relatedMissingMessage is the RelatedMissing Event of a service-origin
// related object the edge did not find at ns/name. With watch.labelSelector
// the edge neither caches nor finds an object without those labels, so the
// message names them: an object that exists unlabelled looks absent, and
// the consumer (or the service owner reading the Event) must learn why.
func relatedMissingMessage(ref *related.Reference, ns, name string) string {
	msg := fmt.Sprintf("related %q: waiting for %s %s/%s in the service cluster", ref.Identifier, ref.Kind.Kind, ns, name)
	if sel := ref.WatchSelector(); sel != "" {
		msg += fmt.Sprintf(" with the labels %s (the entry's watch.labelSelector: the edge finds only objects that carry them)", sel)
	}
	return msg
}
