package replication

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// cached returns pr's cached kcp object behind key (nil when not cached or
// replaced by another object of the same name).
func (m *Manager) cached(pr string, key *ferryv1.ObjectKey) (*unstructured.Unstructured, error) {
	m.mu.Lock()
	w, ok := m.running[pr]
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("PublishedResource %q is not synced", pr)
	}
	if !m.listedFor(w.store, key.GetCluster()) {
		return nil, errNotListed
	}
	raw, exists, err := w.store.GetByKey(storeKey(key))
	if err != nil || !exists {
		return nil, err
	}
	obj := raw.(*unstructured.Unstructured)
	if string(obj.GetUID()) != key.GetUid() {
		return nil, nil
	}
	return obj, nil
}

// errNotListed is transient: the published resource's watch has not listed.
var errNotListed = errors.New("the published resource is not listed yet")

// ErrNoStatus is returned by WriteStatus for resources without a status
// subresource.
var ErrNoStatus = errors.New("the resource has no status subresource; status is not synced back")

// WriteStatus replaces the kcp object's status with status (JSON) unless
// it already holds that status (compared with the cached object: no write,
// no new resourceVersion). written tells whether it wrote.
func (m *Manager) WriteStatus(ctx context.Context, pr string, key *ferryv1.ObjectKey, status []byte) (written bool, err error) {
	m.mu.Lock()
	res, ok := m.desired[pr]
	m.mu.Unlock()
	if !ok {
		return false, fmt.Errorf("PublishedResource %q is not synced", pr)
	}
	if !res.HasStatus {
		return false, ErrNoStatus
	}
	if err := m.checkKey(pr, key); err != nil {
		return false, err
	}
	var value any
	// Kubernetes' JSON decoding, as the informer's: whole numbers stay int64.
	if err := utiljson.Unmarshal(status, &value); err != nil {
		return false, fmt.Errorf("%w: status is not JSON: %v", ErrRefused, err)
	}
	obj, err := m.cached(pr, key)
	if err != nil {
		return false, err
	}
	if obj == nil {
		return false, fmt.Errorf("%w: %s is gone from kcp", ErrGone, KeyString(key))
	}
	if !m.holds(pr, res, obj) {
		m.refused.Add(1)
		return false, fmt.Errorf("%w: %s is not synced for this edge (no finalizer, or outside the PublishedResource's filters)", ErrRefused, KeyString(key))
	}
	if current, found := obj.Object["status"]; found && reflect.DeepEqual(current, value) {
		return false, nil
	}
	ri, err := m.resourceClient(key)
	if err != nil {
		return false, err
	}
	patch, err := json.Marshal([]map[string]any{
		{"op": "test", "path": "/metadata/uid", "value": key.GetUid()},
		{"op": "add", "path": "/status", "value": value},
	})
	if err != nil {
		return false, err
	}
	_, err = ri.Patch(ctx, key.GetName(), types.JSONPatchType, patch, metav1.PatchOptions{}, "status")
	return err == nil, notServedIsTransient(err)
}

// ErrGone marks a report about an object that no longer exists in kcp
// (final: retrying cannot help).
var ErrGone = errors.New("gone")
