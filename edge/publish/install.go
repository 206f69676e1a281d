package publish

import (
	"context"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	watchtools "k8s.io/client-go/tools/watch"
	"sigs.k8s.io/yaml"

	"github.com/ferry-dev/ferry/deploy/crd"
)

// fieldManager is the edge's server-side apply identity.
const fieldManager = "ferry-edge"

// InstallCRD creates or updates the PublishedResource CRD (server-side
// apply) and waits until the API server serves it.
func InstallCRD(ctx context.Context, cfg *rest.Config) error {
	var want apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(crd.PublishedResource, &want); err != nil {
		return fmt.Errorf("embedded CRD manifest is invalid: %w", err)
	}
	want.TypeMeta = metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"}
	data, err := yaml.Marshal(&want)
	if err != nil {
		return err
	}
	client, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	crds := client.ApiextensionsV1().CustomResourceDefinitions()
	force := true
	if _, err := crds.Patch(ctx, want.Name, "application/apply-patch+yaml", data, metav1.PatchOptions{FieldManager: fieldManager, Force: &force}); err != nil {
		return fmt.Errorf("cannot install CRD %s: %w", want.Name, err)
	}
	w, err := crds.Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", want.Name).String()})
	if err != nil {
		return fmt.Errorf("cannot watch CRD %s: %w", want.Name, err)
	}
	_, err = watchtools.UntilWithoutRetry(ctx, w, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Deleted {
			return false, apierrors.NewNotFound(apiextensionsv1.Resource("customresourcedefinitions"), want.Name)
		}
		c, ok := ev.Object.(*apiextensionsv1.CustomResourceDefinition)
		if !ok {
			return false, nil
		}
		for _, cond := range c.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s not established: %w", want.Name, err)
	}
	return waitDiscovery(ctx, cfg, &want)
}

// waitDiscovery waits until the API server's discovery lists the CRD's
// resource: Established can come before discovery does, and
// controller-runtime's REST mapper then fails to start the manager (a fresh
// cluster, seen in make bench). Discovery has no watch; it is polled, once,
// at start.
func waitDiscovery(ctx context.Context, cfg *rest.Config, crd *apiextensionsv1.CustomResourceDefinition) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	gv := crd.Spec.Group + "/" + crd.Spec.Versions[0].Name
	var last error
	err = wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
		list, err := dc.ServerResourcesForGroupVersion(gv)
		if err != nil {
			last = err
			return false, nil
		}
		for _, r := range list.APIResources {
			if r.Name == crd.Spec.Names.Plural {
				return true, nil
			}
		}
		last = fmt.Errorf("%s does not list %s yet", gv, crd.Spec.Names.Plural)
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("CRD %s is established but not in the API server's discovery: %w (last: %v)", crd.Name, err, last)
	}
	return nil
}
