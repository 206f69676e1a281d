package v1alpha1

import "testing"

func TestSpecDefaults(t *testing.T) {
	no, yes := false, true
	cases := []struct {
		name         string
		spec         PublishedResourceSpec
		wantPolicy   DeletionPolicy
		wantDisabled bool
	}{
		{name: "defaults", spec: PublishedResourceSpec{}, wantPolicy: DeletionPolicyOrphan},
		{name: "delete", spec: PublishedResourceSpec{DeletionPolicy: DeletionPolicyDelete}, wantPolicy: DeletionPolicyDelete},
		{name: "orphan", spec: PublishedResourceSpec{DeletionPolicy: DeletionPolicyOrphan}, wantPolicy: DeletionPolicyOrphan},
		{name: "unknown value is orphan (never deletes by mistake)", spec: PublishedResourceSpec{DeletionPolicy: "Purge"}, wantPolicy: DeletionPolicyOrphan},
		{name: "synchronization without enabled", spec: PublishedResourceSpec{Synchronization: &SynchronizationSpec{}}, wantPolicy: DeletionPolicyOrphan},
		{name: "enabled", spec: PublishedResourceSpec{Synchronization: &SynchronizationSpec{Enabled: &yes}}, wantPolicy: DeletionPolicyOrphan},
		{name: "disabled", spec: PublishedResourceSpec{Synchronization: &SynchronizationSpec{Enabled: &no}}, wantPolicy: DeletionPolicyOrphan, wantDisabled: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.spec.EffectiveDeletionPolicy(); got != tc.wantPolicy {
				t.Errorf("EffectiveDeletionPolicy() = %q, want %q", got, tc.wantPolicy)
			}
			if got := tc.spec.SyncDisabled(); got != tc.wantDisabled {
				t.Errorf("SyncDisabled() = %v, want %v", got, tc.wantDisabled)
			}
		})
	}
}

func TestOriginNormalized(t *testing.T) {
	for in, want := range map[RelatedResourceOrigin]RelatedResourceOrigin{
		OriginPlatform: OriginKCP, OriginKCP: OriginKCP, OriginService: OriginService, "other": "other",
	} {
		if got := in.Normalized(); got != want {
			t.Errorf("%q.Normalized() = %q, want %q", in, got, want)
		}
	}
}

func TestEffectiveConflictPolicy(t *testing.T) {
	cases := []struct {
		name string
		in   ConflictPolicy
		want ConflictPolicy
	}{
		{"unset is Fail", "", ConflictPolicyFail},
		{"Fail", ConflictPolicyFail, ConflictPolicyFail},
		{"Adopt", ConflictPolicyAdopt, ConflictPolicyAdopt},
		{"unknown value is Fail (never takes an object over by mistake)", "Take", ConflictPolicyFail},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := PublishedResourceSpec{ConflictPolicy: tc.in}
			if got := s.EffectiveConflictPolicy(); got != tc.want {
				t.Errorf("EffectiveConflictPolicy() = %q, want %q", got, tc.want)
			}
		})
	}
}
