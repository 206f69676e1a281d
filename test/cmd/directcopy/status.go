package main

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/ferry-dev/ferry/pkg/watching"
)

// newLocalInformer watches our local copies (all namespaces). Their
// namespace/name is unique, so a shared informer's default key is fine.
func (c *copier) newLocalInformer() (cache.SharedIndexInformer, error) {
	ri := c.local.Resource(c.o.localResource)
	inf := cache.NewSharedIndexInformer(watching.ListWatch(ri, clusterLabel), &unstructured.Unstructured{}, 0, cache.Indexers{})
	if err := inf.SetTransform(dropManagedFields); err != nil {
		return nil, err
	}
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.localChanged,
		UpdateFunc: func(_, obj any) { c.localChanged(obj) },
		DeleteFunc: c.localDeleted,
	})
	return inf, err
}

func (c *copier) localChanged(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	key := u.GetNamespace() + "/" + u.GetName()
	c.pending.Delete(key)
	if _, ok := u.Object["status"]; ok {
		c.statusQueue.Add(key)
	}
}

// localDeleted re-enqueues the kcp object, whose deletion may wait for
// this copy to be gone.
func (c *copier) localDeleted(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	c.pending.Delete(u.GetNamespace() + "/" + u.GetName())
	if cluster := u.GetLabels()[clusterLabel]; cluster != "" {
		c.kcpQueue.Add(kcpKey(cluster, u.GetLabels()[namespaceLabel], u.GetName()))
	}
}

// syncStatus writes the status of the local copy key (namespace/name) to
// its kcp object unless kcp has it already.
func (c *copier) syncStatus(ctx context.Context, key string) error {
	local := c.localCopy(key)
	if local == nil {
		return nil
	}
	status, ok := local.Object["status"]
	cluster := local.GetLabels()[clusterLabel]
	if !ok || cluster == "" {
		return nil
	}
	item, exists, err := c.kcpStore.GetByKey(kcpKey(cluster, local.GetLabels()[namespaceLabel], local.GetName()))
	if err != nil || !exists {
		return err
	}
	obj := item.(*unstructured.Unstructured)
	if equality.Semantic.DeepEqual(status, obj.Object["status"]) {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"status": mergePatch(status, obj.Object["status"])})
	if err != nil {
		return err
	}
	d, err := c.kcpClient(cluster)
	if err != nil {
		return err
	}
	_, err = d.Resource(c.o.resource).Namespace(obj.GetNamespace()).Patch(ctx, obj.GetName(), types.MergePatchType, patch,
		metav1.PatchOptions{}, "status")
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("cannot write status of %s: %w", kcpKey(cluster, obj.GetNamespace(), obj.GetName()), err)
	}
	return nil
}

// mergePatch is want as a JSON merge patch over have: fields of have that
// want lacks become null, else a merge patch would keep them and the two
// statuses would never compare equal.
func mergePatch(want, have any) any {
	w, ok := want.(map[string]any)
	h, ok2 := have.(map[string]any)
	if !ok || !ok2 {
		return want
	}
	out := make(map[string]any, len(w))
	for k, v := range w {
		out[k] = mergePatch(v, h[k])
	}
	for k := range h {
		if _, ok := w[k]; !ok {
			out[k] = nil
		}
	}
	return out
}
