package publish

import (
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// TestProjectedRelatedClaimsAndScope: a projected entry is claimed and
// checked in kcp under its kcp-side resource — the projected one for origin
// service, the configured one for origin kcp — and the APIExport's own
// group (a kind another PublishedResource of this edge publishes) needs no
// claim.
func TestProjectedRelatedClaimsAndScope(t *testing.T) {
	specs := []ferryv1alpha1.RelatedResourceSpec{
		// A ConfigMap on the service cluster becomes a Secret in kcp.
		{Identifier: "a", Origin: ferryv1alpha1.OriginService, Resource: "configmaps",
			Projection: &ferryv1alpha1.RelatedResourceProjection{Resource: "secrets"}},
		// A local CRD projected into the export's group: no claim.
		{Identifier: "b", Origin: ferryv1alpha1.OriginService, Group: "db.corp.example", Version: "v1alpha1", Resource: "userdatabases",
			Projection: &ferryv1alpha1.RelatedResourceProjection{Group: "export.example", Version: "v1"}},
		// Origin kcp reads the configured resource in kcp; the service
		// cluster's projected group is not claimed.
		{Identifier: "c", Origin: ferryv1alpha1.OriginKCP, Group: "certs.example", Resource: "issuers",
			Projection: &ferryv1alpha1.RelatedResourceProjection{Group: "cert-manager.io"}},
	}
	got := relatedClaims("export.example", specs)
	want := []string{"secrets", "issuers.certs.example"}
	if len(got) != len(want) {
		t.Fatalf("claims %v, want %v", got, want)
	}
	for i, w := range want {
		if got[i].String() != w {
			t.Errorf("claim %d = %v, want %s", i, got[i], w)
		}
	}

	discovery := map[string]*metav1.APIResourceList{
		"v1":               {GroupVersion: "v1", APIResources: []metav1.APIResource{{Name: "secrets", Namespaced: true, Kind: "Secret"}}},
		"certs.example/v1": {GroupVersion: "certs.example/v1", APIResources: []metav1.APIResource{{Name: "issuers", Namespaced: true, Kind: "Issuer"}}},
	}
	resourcesFor := func(gv string) (*metav1.APIResourceList, error) {
		if l, ok := discovery[gv]; ok {
			return l, nil
		}
		return nil, apierrors.NewNotFound(schema.GroupResource{}, gv)
	}
	if msg, err := relatedScopeProblem("export.example", specs, resourcesFor); err != nil || msg != "" {
		t.Errorf("scope problem %q, %v; want none: kcp serves every kcp-side resource", msg, err)
	}
	// The service cluster's resource of a service-origin entry is not
	// looked for in kcp; its projection is.
	bad := []ferryv1alpha1.RelatedResourceSpec{{Identifier: "d", Origin: ferryv1alpha1.OriginService, Resource: "secrets",
		Projection: &ferryv1alpha1.RelatedResourceProjection{Resource: "sealedsecrets"}}}
	if msg, _ := relatedScopeProblem("export.example", bad, resourcesFor); !strings.Contains(msg, "kcp does not serve sealedsecrets") {
		t.Errorf("scope problem %q, want kcp does not serve sealedsecrets", msg)
	}
}

// TestProjectedRelatedKinds: the kind in kcp of a projected entry comes
// from the APIResourceSchema the APIExport serves for its own group, from
// the Publish itself for the primary's own resource, and from kcp's
// discovery otherwise; an own resource not in the APIExport yet is retried
// with a message that says to publish it; unprojected entries get none.
func TestProjectedRelatedKinds(t *testing.T) {
	l := kindLookup{
		ownGroup: "export.example", self: "queues", selfKind: "Queue",
		ownSchema: func(plural string) (string, error) {
			switch plural {
			case "userdatabases":
				return "v123.userdatabases.export.example", nil
			case "broken":
				return "", errors.New("connection refused")
			}
			return "", nil
		},
		schemaKind: func(name string) (string, []string, error) {
			if name == "v123.userdatabases.export.example" {
				return "UserDatabase", []string{"v1", "v2"}, nil
			}
			return "", nil, apierrors.NewNotFound(schema.GroupResource{}, name)
		},
		resourcesFor: func(gv string) (*metav1.APIResourceList, error) {
			if gv == "v1" {
				return &metav1.APIResourceList{APIResources: []metav1.APIResource{{Name: "secrets", Kind: "Secret", Namespaced: true}}}, nil
			}
			return nil, apierrors.NewNotFound(schema.GroupResource{}, gv)
		},
	}
	proj := func(id string, origin ferryv1alpha1.RelatedResourceOrigin, group, resource string, p ferryv1alpha1.RelatedResourceProjection) ferryv1alpha1.RelatedResourceSpec {
		return ferryv1alpha1.RelatedResourceSpec{Identifier: id, Origin: origin, Group: group, Resource: resource, Projection: &p}
	}
	got, refusal, err := l.kinds([]ferryv1alpha1.RelatedResourceSpec{
		proj("db", ferryv1alpha1.OriginService, "db.corp.example", "userdatabases", ferryv1alpha1.RelatedResourceProjection{Group: "export.example"}),
		proj("self", ferryv1alpha1.OriginService, "mq.corp.example", "queues", ferryv1alpha1.RelatedResourceProjection{Group: "export.example"}),
		proj("cm", ferryv1alpha1.OriginService, "", "configmaps", ferryv1alpha1.RelatedResourceProjection{Resource: "secrets"}),
		proj("back", ferryv1alpha1.OriginKCP, "", "secrets", ferryv1alpha1.RelatedResourceProjection{Resource: "configmaps"}),
		{Identifier: "plain", Origin: ferryv1alpha1.OriginService, Kind: "Secret"},
	})
	if err != nil || refusal != "" {
		t.Fatal(err, refusal)
	}
	want := map[string]string{"db": "UserDatabase", "self": "Queue", "cm": "Secret", "back": "Secret"}
	if len(got) != len(want) {
		t.Fatalf("kinds %v, want %v", got, want)
	}
	for _, k := range got {
		if want[k.GetIdentifier()] != k.GetKind() {
			t.Errorf("kind of %s = %q, want %q", k.GetIdentifier(), k.GetKind(), want[k.GetIdentifier()])
		}
	}

	for _, tc := range []struct {
		name, resource, version, wantErr, wantRefusal string
	}{
		{name: "own resource not published yet", resource: "ledgers", wantErr: "the APIExport does not serve ledgers.export.example yet: publish it first"},
		{name: "export unreadable", resource: "broken", wantErr: "cannot read the APIExport export.example"},
		{name: "own resource in a version the export does not serve", resource: "userdatabases", version: "v1alpha1",
			wantRefusal: "spec.related[x]: the APIExport serves userdatabases.export.example in version(s) v1, v2, not v1alpha1: set the version of kcp's side"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, refusal, err := l.kinds([]ferryv1alpha1.RelatedResourceSpec{
				proj("x", ferryv1alpha1.OriginService, "corp.example", tc.resource, ferryv1alpha1.RelatedResourceProjection{Group: "export.example", Version: tc.version})})
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("error %v, want one containing %q", err, tc.wantErr)
			}
			if tc.wantRefusal != "" && (err != nil || !strings.Contains(refusal, tc.wantRefusal)) {
				t.Errorf("refusal %q (error %v), want one containing %q", refusal, err, tc.wantRefusal)
			}
		})
	}
}
