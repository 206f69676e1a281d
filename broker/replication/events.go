package replication

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

var eventsGVR = schema.GroupVersionResource{Version: "v1", Resource: "events"}

// eventName is the name of the one Event per kcp object and reason: the
// object's name and a hash of its UID and the reason.
func eventName(key *ferryv1.ObjectKey, reason string) string {
	sum := sha256.Sum256([]byte(key.GetUid() + "|" + reason))
	suffix := "." + hex.EncodeToString(sum[:8])
	return naming.Shorten(key.GetName(), validation.DNS1123SubdomainMaxLength-len(suffix)) + suffix
}

// recordEvent records an Event on the kcp object behind key (through the
// APIExport's "events" permission claim). There is one Event per object and
// reason: a repeat updates its count, message and lastTimestamp instead of
// creating another, so an object that keeps failing never floods its
// namespace.
//
// Why not client-go's tools/events recorder: the broker writes into many
// workspaces, each through its own virtual-workspace client, and the
// recorder binds one sink per broadcaster and aggregates in memory (lost on
// a restart). A deterministic name aggregates across restarts: one request
// for the first Event, three (create, get, update) for each repeat.
func (m *Manager) recordEvent(ctx context.Context, pr string, key *ferryv1.ObjectKey, eventType, reason, message string) error {
	m.mu.Lock()
	w, ok := m.running[pr]
	m.mu.Unlock()
	if !ok {
		return nil
	}
	raw, exists, err := w.store.GetByKey(storeKey(key))
	if err != nil || !exists {
		return err
	}
	obj := raw.(*unstructured.Unstructured)
	c, err := m.client(key.GetCluster())
	if err != nil {
		return err
	}
	ns := key.GetNamespace()
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	events := c.Resource(eventsGVR).Namespace(ns)
	now := metav1.Now().UTC().Format(time.RFC3339)
	involved := map[string]any{
		"apiVersion": obj.GetAPIVersion(), "kind": obj.GetKind(), "name": key.GetName(),
		"namespace": key.GetNamespace(), "uid": key.GetUid(), "resourceVersion": obj.GetResourceVersion(),
	}
	event := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion":         "v1",
		"kind":               "Event",
		"metadata":           map[string]any{"name": eventName(key, reason), "namespace": ns},
		"involvedObject":     involved,
		"type":               eventType,
		"reason":             reason,
		"message":            message,
		"source":             map[string]any{"component": "ferry-broker"},
		"reportingComponent": "ferry.dev/broker",
		"reportingInstance":  m.opts.EdgeName,
		"firstTimestamp":     now,
		"lastTimestamp":      now,
		"count":              int64(1),
	}}
	_, err = events.Create(ctx, event, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	existing, err := events.Get(ctx, event.GetName(), metav1.GetOptions{})
	if apierrors.IsForbidden(err) {
		return nil // an events claim without get/update (see eventsClaim): the Event exists
	}
	if err != nil {
		return err
	}
	count, _, _ := unstructured.NestedInt64(existing.Object, "count")
	existing.Object["count"] = count + 1
	existing.Object["lastTimestamp"] = now
	existing.Object["message"] = message
	existing.Object["type"] = eventType
	existing.Object["involvedObject"] = involved
	_, err = events.Update(ctx, existing, metav1.UpdateOptions{})
	return err
}

// RecordFailure records that the edge could not apply the object behind key
// as a Warning Event on the kcp object, so the kcp user sees why it is not
// synced (through the APIExport's "events" permission claim).
// related tells that the failure is about one of the object's related
// objects. A refusal by the edge (where the object would land) has its own
// reason, SyncForbidden or RelatedForbidden.
func (m *Manager) RecordFailure(ctx context.Context, pr string, key *ferryv1.ObjectKey, applyErr *ferryv1.ApplyError, related bool) error {
	reason := "SyncFailed"
	if applyErr.GetReason() == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN {
		reason = "SyncForbidden"
		if related {
			reason = "RelatedForbidden"
		}
		return m.recordEvent(ctx, pr, key, "Warning", reason, "the service cluster's edge refused: "+applyErr.GetMessage())
	}
	return m.recordEvent(ctx, pr, key, "Warning", reason, fmt.Sprintf("the service cluster did not accept this object (%s): %s",
		reasonText(applyErr.GetReason()), applyErr.GetMessage()))
}

// RecordStatusFailure records, as a Warning Event on the kcp object, that
// its local status could not be synced back (e.g. too large for the stream).
func (m *Manager) RecordStatusFailure(ctx context.Context, pr string, key *ferryv1.ObjectKey, applyErr *ferryv1.ApplyError) error {
	return m.recordEvent(ctx, pr, key, "Warning", "StatusNotSynced", fmt.Sprintf("the status of the local copy was not synced back (%s): %s",
		reasonText(applyErr.GetReason()), applyErr.GetMessage()))
}

func reasonText(r ferryv1.ApplyErrorReason) string {
	switch r {
	case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_REJECTED:
		return "rejected"
	case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED:
		return "not published"
	case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID:
		return "invalid"
	case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_TOO_LARGE:
		return "too large"
	case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_UNAVAILABLE:
		return "service cluster unavailable"
	case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT:
		return "conflict"
	case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN:
		return "forbidden"
	default:
		return "error"
	}
}
