package framework

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// ApplyFile server-side-applies every object in a multi-document YAML file
// to the cluster behind cfg, as field manager "ferry-test".
func ApplyFile(ctx context.Context, cfg *rest.Config, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	objs, err := DecodeYAML(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for _, o := range objs {
		if err := Apply(ctx, cfg, o); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	return nil
}

// DecodeYAML decodes a multi-document YAML stream.
func DecodeYAML(r io.Reader) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var out []*unstructured.Unstructured
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(obj.Object) > 0 {
			out = append(out, &obj)
		}
	}
}

// Apply server-side-applies obj (forcing ownership) to the cluster behind cfg.
func Apply(ctx context.Context, cfg *rest.Config, obj *unstructured.Unstructured) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	gvk := obj.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return fmt.Errorf("%s: %w", gvk, err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	data, err := yaml.Marshal(obj.Object)
	if err != nil {
		return err
	}
	force := true
	_, err = dyn.Resource(m.Resource).Namespace(obj.GetNamespace()).Patch(ctx, obj.GetName(), types.ApplyYAMLPatchType, data,
		metav1.PatchOptions{FieldManager: "ferry-test", Force: &force})
	if err != nil {
		return fmt.Errorf("cannot apply %s %s: %w", gvk.Kind, obj.GetName(), err)
	}
	return nil
}
