package related

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// TestProjectionSides: the entry's group, version and resource are the
// origin side's, the projection's fields replace them on the destination
// side (unset: unchanged); kcp is the destination for origin service and
// the origin for origin kcp (and platform). The compiled entry carries the
// same pair, and the kind of a side whose resource is projected is left
// for that side to resolve.
func TestProjectionSides(t *testing.T) {
	gvr := func(g, v, r string) schema.GroupVersionResource {
		return schema.GroupVersionResource{Group: g, Version: v, Resource: r}
	}
	objRef := &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
		Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.dbName"}}}
	tests := []struct {
		name                  string
		spec                  ferryv1alpha1.RelatedResourceSpec
		wantKCP, wantService  schema.GroupVersionResource
		wantKind, wantSvcKind string
	}{
		{name: "no projection, kind",
			spec:    ferryv1alpha1.RelatedResourceSpec{Origin: ferryv1alpha1.OriginService, Kind: "Secret", Object: objRef},
			wantKCP: gvr("", "v1", "secrets"), wantService: gvr("", "v1", "secrets"), wantKind: "Secret", wantSvcKind: "Secret"},
		{name: "no projection, resource",
			spec:    ferryv1alpha1.RelatedResourceSpec{Origin: ferryv1alpha1.OriginKCP, Resource: "configmaps", Object: objRef},
			wantKCP: gvr("", "v1", "configmaps"), wantService: gvr("", "v1", "configmaps")},
		{name: "origin service, group and version projected into kcp",
			spec: ferryv1alpha1.RelatedResourceSpec{Origin: ferryv1alpha1.OriginService, Group: "db.corp.example", Version: "v1alpha1", Resource: "userdatabases",
				Projection: &ferryv1alpha1.RelatedResourceProjection{Group: "api.example.com", Version: "v2"}, Object: objRef},
			wantKCP: gvr("api.example.com", "v2", "userdatabases"), wantService: gvr("db.corp.example", "v1alpha1", "userdatabases")},
		{name: "origin service, resource projected, group kept",
			spec: ferryv1alpha1.RelatedResourceSpec{Origin: ferryv1alpha1.OriginService, Resource: "configmaps",
				Projection: &ferryv1alpha1.RelatedResourceProjection{Resource: "secrets"}, Object: objRef},
			wantKCP: gvr("", "v1", "secrets"), wantService: gvr("", "v1", "configmaps")},
		{name: "origin kcp: the projection undone on the service cluster",
			spec: ferryv1alpha1.RelatedResourceSpec{Origin: ferryv1alpha1.OriginKCP, Group: "api.example.com", Version: "v2", Resource: "userdatabases",
				Projection: &ferryv1alpha1.RelatedResourceProjection{Group: "db.corp.example", Version: "v1alpha1"}, Object: objRef},
			wantKCP: gvr("api.example.com", "v2", "userdatabases"), wantService: gvr("db.corp.example", "v1alpha1", "userdatabases")},
		{name: "origin platform is kcp",
			spec: ferryv1alpha1.RelatedResourceSpec{Origin: ferryv1alpha1.OriginPlatform, Resource: "secrets",
				Projection: &ferryv1alpha1.RelatedResourceProjection{Resource: "configmaps"}, Object: objRef},
			wantKCP: gvr("", "v1", "secrets"), wantService: gvr("", "v1", "configmaps")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := KCPResource(&tc.spec); got != tc.wantKCP {
				t.Errorf("KCPResource = %v, want %v", got, tc.wantKCP)
			}
			if got := ServiceResource(&tc.spec); got != tc.wantService {
				t.Errorf("ServiceResource = %v, want %v", got, tc.wantService)
			}
			refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{tc.spec})
			if err != nil {
				t.Fatal(err)
			}
			r := refs[0]
			if r.Resource != tc.wantKCP || r.Service != tc.wantService {
				t.Errorf("compiled kcp %v service %v, want %v and %v", r.Resource, r.Service, tc.wantKCP, tc.wantService)
			}
			if r.Kind != tc.wantKCP.GroupVersion().WithKind(tc.wantKind) || r.ServiceKind != tc.wantSvcKind {
				t.Errorf("compiled kind %v, service kind %q; want %q and %q", r.Kind, r.ServiceKind, tc.wantKind, tc.wantSvcKind)
			}
			if r.Projected != (tc.spec.Projection != nil) {
				t.Errorf("Projected = %v", r.Projected)
			}
		})
	}
}

// TestResolveKindsOfAProjection: each side's kind is resolved on its own
// when the entry is projected, and on both at once when it is not.
func TestResolveKindsOfAProjection(t *testing.T) {
	objRef := &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
		Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.name"}}}
	refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{
		{Identifier: "plain", Origin: ferryv1alpha1.OriginService, Resource: "secrets", Object: objRef},
		{Identifier: "projected", Origin: ferryv1alpha1.OriginService, Resource: "configmaps",
			Projection: &ferryv1alpha1.RelatedResourceProjection{Resource: "secrets"}, Object: objRef},
	})
	if err != nil {
		t.Fatal(err)
	}
	plain, projected := refs[0], refs[1]
	plain.ResolveServiceKind("Secret")
	if plain.Kind.Kind != "Secret" || plain.ServiceKind != "Secret" {
		t.Errorf("unprojected: kind %q, service kind %q; want Secret on both", plain.Kind.Kind, plain.ServiceKind)
	}
	projected.ResolveServiceKind("ConfigMap")
	projected.ResolveKind("Secret")
	if projected.Kind.Kind != "Secret" || projected.ServiceKind != "ConfigMap" {
		t.Errorf("projected: kind %q, service kind %q; want Secret in kcp and ConfigMap on the service cluster", projected.Kind.Kind, projected.ServiceKind)
	}
}
