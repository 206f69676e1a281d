package replication

import (
	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// relatedGone handles a related object that left the service cluster:
// references to it are reported again (service origin), and when it was
// this edge's copy of a kcp-origin related object whose primary copy stays,
// someone else deleted it: the edge asks the broker for it again (the edge
// keeps no content of related objects to repair them from).
func (e *Engine) relatedGone(rw *relatedWatch, obj any) {
	e.relatedChanged(rw, obj)
	u, ok := informerObject(obj)
	if !ok {
		return
	}
	l := u.GetLabels()
	uid, id := l[naming.LabelRelatedTo], l[naming.LabelRelatedIdentifier]
	if uid == "" || id == "" || l[naming.LabelAgent] != e.opts.Agent {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, w := range e.watches {
		ref := w.pub.related(id)
		if w.withdrawn || ref == nil || ref.Origin != ferryv1alpha1.OriginKCP || ref.Local != rw.gvr {
			continue
		}
		primaries, err := w.store.ByIndex(remoteUIDIndex, uid)
		if err != nil {
			continue
		}
		for _, p := range primaries {
			primary, ok := informerObject(p)
			if !ok || primary.GetDeletionTimestamp() != nil {
				continue
			}
			remote, ok := naming.RemoteFrom(primary.GetLabels(), primary.GetAnnotations())
			if !ok {
				continue
			}
			key := remoteKey(w.pub, remote)
			k := keyFor(w.pub.Name, key)
			if e.ledger.deleting(k) {
				continue
			}
			e.opts.Log.Info("related copy deleted outside ferry; asking the broker for it again", logging.KeyObject, k.String(),
				"related", id, "local", nsName(u.GetNamespace(), u.GetName()))
			e.report(reportKey{kind: reportResendRelated, object: k, identifier: id}, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_ResendRequest{ResendRequest: &ferryv1.ResendRequest{
				Key: key, Reason: "deleted", RelatedTo: &ferryv1.RelatedTo{Primary: key, Identifier: id},
			}}})
		}
	}
}
