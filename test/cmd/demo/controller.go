package main

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/ferry-dev/ferry/pkg/watching"
)

// runDatabaseController plays the service's own controller in the service
// cluster, cert-manager style: for every Database it creates the Secret its
// spec.secretName names, with (made-up) connection details. It runs until
// ctx ends.
func runDatabaseController(ctx context.Context, cfg *rest.Config) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	gvr := schema.GroupVersionResource{Group: "demo.example.com", Version: "v1", Resource: "databases"}
	informer := cache.NewSharedIndexInformer(watching.ListWatch(dyn.Resource(gvr), ""), &unstructured.Unstructured{}, 0, cache.Indexers{})
	ensure := func(obj any) {
		db, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return
		}
		name, _, _ := unstructured.NestedString(db.Object, "spec", "secretName")
		if name == "" {
			return
		}
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: db.GetNamespace(), Labels: map[string]string{"demo.example.com/database": db.GetName()}},
			StringData: map[string]string{
				"host":     fmt.Sprintf("%s.db.example.com", db.GetName()),
				"port":     "5432",
				"username": "app",
				"password": "demo-" + string(db.GetUID())[:8],
			},
		}
		if _, err := kube.CoreV1().Secrets(db.GetNamespace()).Create(ctx, secret, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) && ctx.Err() == nil {
			fmt.Printf("    demo controller: cannot create Secret %s/%s: %v\n", db.GetNamespace(), name, err)
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: ensure, UpdateFunc: func(_, obj any) { ensure(obj) },
	}); err != nil {
		return err
	}
	go informer.RunWithContext(ctx)
	return nil
}
