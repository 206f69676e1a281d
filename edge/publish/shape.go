package publish

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// copyShape identifies the settings of pr that shape a local copy beyond
// its kcp object's content: spec mutations, naming, the local resource and
// whether local edits are kept (switching re-applies every copy: Repair
// repairs the kept edits, Keep records its base) and the service-owned
// paths (a changed set is handed over on every copy).
// A copy applied under another shape is applied again (replica.Published.
// Shape), so a changed mutation reaches existing copies, not only objects
// that change in kcp later.
func copyShape(pr *ferryv1alpha1.PublishedResource, crd *apiextensionsv1.CustomResourceDefinition) string {
	var spec []ferryv1alpha1.ResourceMutation
	if pr.Spec.Mutation != nil {
		spec = pr.Spec.Mutation.Spec
	}
	data, err := json.Marshal(struct {
		Mutations []ferryv1alpha1.ResourceMutation `json:"m,omitempty"`
		Naming    *ferryv1alpha1.ResourceNaming    `json:"n,omitempty"`
		Group     string                           `json:"g"`
		Kind      string                           `json:"k"`
		// Only when not the default, so copies of PublishedResources
		// that do not set it keep their shape.
		Keep         bool     `json:"keep,omitempty"`
		ServiceOwned []string `json:"so,omitempty"`
	}{spec, pr.Spec.Naming, crd.Spec.Group, crd.Spec.Names.Kind, pr.Spec.EffectiveLocalEdits() == ferryv1alpha1.LocalEditsKeep, pr.Spec.ServiceOwnedPaths})
	if err != nil {
		// Plain API types always marshal; an empty shape only costs a
		// re-apply once they do again.
		return ""
	}
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:8])
}
