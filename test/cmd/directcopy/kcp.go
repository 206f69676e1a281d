package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/kcp-dev/logicalcluster/v3"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"github.com/ferry-dev/ferry/pkg/watching"
)

const (
	fieldManager   = "directcopy"
	clusterLabel   = "directcopy.ferry.dev/cluster"
	namespaceLabel = "directcopy.ferry.dev/namespace"
	hashAnnotation = "directcopy.ferry.dev/spec-hash"
)

// clusterKey keys kcp objects as <cluster>|<namespace>/<name>: through
// /clusters/* the same namespace/name exists in many workspaces.
func clusterKey(obj any) (string, error) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Key, nil
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return "", err
	}
	return kcpKey(logicalcluster.From(m).String(), m.GetNamespace(), m.GetName()), nil
}

func kcpKey(cluster, namespace, name string) string {
	return cluster + "|" + namespace + "/" + name
}

// dropManagedFields saves memory: managedFields are never read.
func dropManagedFields(obj any) (any, error) {
	if m, err := meta.Accessor(obj); err == nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// specHash identifies a spec so that an unchanged one is not applied
// again; encoding/json sorts map keys, so equal specs hash equally.
func specHash(spec any) (string, error) {
	b, err := json.Marshal(spec)
	if err != nil {
		return "", fmt.Errorf("cannot encode spec: %w", err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16]), nil
}

// newKCPInformer lists and watches ri (all clusters, all namespaces) into
// a store keyed by clusterKey and enqueues the key of every change. It is
// client-go's informer loop by hand because shared informers key by
// namespace/name only.
func newKCPInformer(ri dynamic.NamespaceableResourceInterface, enqueue func(string)) (cache.Indexer, cache.Controller) {
	store := cache.NewIndexer(clusterKey, cache.Indexers{})
	fifo := cache.NewDeltaFIFOWithOptions(cache.DeltaFIFOOptions{
		KeyFunction: clusterKey, KnownObjects: store, EmitDeltaTypeReplaced: true, Transformer: dropManagedFields,
	})
	// List, then watch: kcp v0.28's virtual workspace left objects out of
	// the streamed initial list (see pkg/watching).
	lw := watching.WithoutWatchList(watching.ListWatch(ri, ""))
	process := func(obj any, _ bool) error {
		deltas, ok := obj.(cache.Deltas)
		if !ok {
			return fmt.Errorf("unexpected %T from the delta FIFO", obj)
		}
		for _, d := range deltas {
			key, err := clusterKey(d.Object)
			if err != nil {
				return err
			}
			if d.Type == cache.Deleted {
				err = store.Delete(d.Object)
			} else {
				err = store.Update(d.Object)
			}
			if err != nil {
				return err
			}
			enqueue(key)
		}
		return nil
	}
	return store, cache.New(&cache.Config{Queue: fifo, ListerWatcher: lw, ObjectType: &unstructured.Unstructured{}, Process: process})
}

// reconcile brings the local copy of one kcp object in line with it.
func (c *copier) reconcile(ctx context.Context, key string) error {
	item, exists, err := c.kcpStore.GetByKey(key)
	if err != nil {
		return err
	}
	if !exists {
		if c.o.finalizer != "" {
			return nil // gone: our finalizer made us see its deletion first
		}
		return c.deleteOrphan(ctx, key)
	}
	obj := item.(*unstructured.Unstructured)
	cluster := logicalcluster.From(obj).String()
	localKey := cluster + "/" + obj.GetName()
	local := c.localCopy(localKey)
	ours := c.o.finalizer != "" && slices.Contains(obj.GetFinalizers(), c.o.finalizer)

	if obj.GetDeletionTimestamp() != nil {
		gone, err := c.deleteLocal(ctx, cluster, obj.GetName(), local)
		if err != nil || !gone || !ours {
			return err
		}
		rest := slices.DeleteFunc(slices.Clone(obj.GetFinalizers()), func(f string) bool { return f == c.o.finalizer })
		return c.setFinalizers(ctx, cluster, obj, rest)
	}
	if !ours && c.o.finalizer != "" {
		return c.setFinalizers(ctx, cluster, obj, append(slices.Clone(obj.GetFinalizers()), c.o.finalizer))
	}
	hash, err := specHash(obj.Object["spec"])
	if err != nil {
		return err
	}
	if local == nil || local.GetAnnotations()[hashAnnotation] != hash {
		return c.apply(ctx, cluster, obj, hash, local == nil)
	}
	// kcp's status was changed behind our back: the local one wins.
	if st, ok := local.Object["status"]; ok && !equality.Semantic.DeepEqual(st, obj.Object["status"]) {
		c.statusQueue.Add(localKey)
	}
	return nil
}

// deleteOrphan deletes the local copy of the kcp object key, which is
// gone (without a finalizer: the watch's delete event, or a copy found by
// sweep). A copy that belongs to an object of another kcp namespace with
// the same name is left alone.
func (c *copier) deleteOrphan(ctx context.Context, key string) error {
	cluster, namespace, name, err := splitKCPKey(key)
	if err != nil {
		return err
	}
	local := c.localCopy(cluster + "/" + name)
	if local != nil && local.GetLabels()[namespaceLabel] != namespace {
		return nil
	}
	_, err = c.deleteLocal(ctx, cluster, name, local)
	return err
}

// splitKCPKey is the inverse of kcpKey.
func splitKCPKey(key string) (cluster, namespace, name string, err error) {
	cluster, rest, ok := strings.Cut(key, "|")
	if ok {
		namespace, name, ok = strings.Cut(rest, "/")
	}
	if !ok || cluster == "" || name == "" {
		return "", "", "", fmt.Errorf("malformed key %q", key)
	}
	return cluster, namespace, name, nil
}

// sweep enqueues the kcp object of every local copy in the cache, so that
// copies whose object was deleted while we were not watching go too (only
// without a finalizer: with one, kcp keeps such objects for us).
func (c *copier) sweep() {
	for _, item := range c.localInformer.GetStore().List() {
		if u, ok := item.(*unstructured.Unstructured); ok && u.GetLabels()[clusterLabel] != "" {
			c.kcpQueue.Add(kcpKey(u.GetLabels()[clusterLabel], u.GetLabels()[namespaceLabel], u.GetName()))
		}
	}
}

func (c *copier) localCopy(key string) *unstructured.Unstructured {
	item, exists, err := c.localInformer.GetStore().GetByKey(key)
	if err != nil || !exists {
		return nil
	}
	return item.(*unstructured.Unstructured)
}

// deleteLocal deletes the local copy and reports whether it is gone. While
// the cache still has it, the informer's delete event re-enqueues the kcp
// key. A copy just applied but not yet in the cache (pending) is deleted
// too, or a quick create-delete would leave it behind.
func (c *copier) deleteLocal(ctx context.Context, cluster, name string, local *unstructured.Unstructured) (bool, error) {
	key := cluster + "/" + name
	_, pending := c.pending.Load(key)
	switch {
	case local == nil && !pending:
		return true, nil
	case local != nil && local.GetDeletionTimestamp() != nil:
		return false, nil // already deleting (it has finalizers of its own)
	}
	err := c.local.Resource(c.o.localResource).Namespace(cluster).Delete(ctx, name, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		if local == nil {
			c.pending.Delete(key)
			return true, nil
		}
		err = nil // the cache lags; its delete event follows
	}
	return false, err
}

// setFinalizers writes obj's finalizer list guarded by its resourceVersion,
// so a concurrent change is not overwritten (the conflict is retried).
func (c *copier) setFinalizers(ctx context.Context, cluster string, obj *unstructured.Unstructured, finalizers []string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"finalizers": finalizers, "resourceVersion": obj.GetResourceVersion(),
	}})
	if err != nil {
		return err
	}
	d, err := c.kcpClient(cluster)
	if err != nil {
		return err
	}
	_, err = d.Resource(c.o.resource).Namespace(obj.GetNamespace()).Patch(ctx, obj.GetName(), types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// apply server-side applies the local copy of obj into namespace cluster.
func (c *copier) apply(ctx context.Context, cluster string, obj *unstructured.Unstructured, hash string, create bool) error {
	if create {
		if err := c.ensureNamespace(ctx, cluster); err != nil {
			return err
		}
		c.pending.Store(cluster+"/"+obj.GetName(), struct{}{}) // before the write: the informer may beat our return
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": c.o.localResource.GroupVersion().String(),
		"kind":       c.o.localKind,
		"metadata": map[string]any{
			"name":        obj.GetName(),
			"namespace":   cluster,
			"labels":      map[string]any{clusterLabel: cluster, namespaceLabel: obj.GetNamespace()},
			"annotations": map[string]any{hashAnnotation: hash},
		},
	}}
	if spec, ok := obj.Object["spec"]; ok {
		u.Object["spec"] = spec
	}
	_, err := c.local.Resource(c.o.localResource).Namespace(cluster).Apply(ctx, obj.GetName(), u,
		metav1.ApplyOptions{FieldManager: fieldManager, Force: true})
	if err != nil {
		return fmt.Errorf("cannot apply %s/%s locally: %w", cluster, obj.GetName(), err)
	}
	return nil
}

// ensureNamespace creates the local namespace of a logical cluster once
// per process.
func (c *copier) ensureNamespace(ctx context.Context, name string) error {
	if _, ok := c.namespaces.Load(name); ok {
		return nil
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := c.kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("cannot create namespace %s: %w", name, err)
	}
	c.namespaces.Store(name, struct{}{})
	return nil
}
