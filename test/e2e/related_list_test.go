package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// TestRelatedListReferenceAndMutation: a related entry whose reference
// returns a list (api-syncagent's spec.users.#.name, each value rewritten
// by a regex) syncs one service-origin Secret per user into kcp; a user
// removed from the list loses its copy, the other stays. The entry's
// mutation shapes each copy on its way into kcp: a regex on a label, a
// label set by CEL, and a data key deleted.
func TestRelatedListReferenceAndMutation(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "roster.example.com", "Roster", "rosters", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Related = []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "creds", Origin: ferryv1alpha1.OriginService, Version: "v1", Resource: "secrets",
			Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
				Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.users.#.name",
					Regex: &ferryv1alpha1.RegexReplacement{Pattern: "^(.*)$", Replacement: `\1-creds`}},
			}},
			Mutation: &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{
				{Regex: &ferryv1alpha1.RegexMutation{Path: "metadata.labels.tier", Pattern: "^internal-(.*)$", Replacement: `\1`}},
				{CEL: &ferryv1alpha1.CELMutation{Path: "metadata.labels.copied-by", Expression: "'ferry'"}},
				{Delete: &ferryv1alpha1.DeleteMutation{Path: "data.internal"}},
			}},
		}}
	})
	svc := serviceKube(t)
	consumer := e.consumerKube(t)
	e.createRemote(t, "default", "team", map[string]any{"users": []any{map[string]any{"name": "alice"}, map[string]any{"name": "bob"}}})
	local := e.waitLocal(t, "default", "team", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	for _, user := range []string{"alice", "bob"} {
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: user + "-creds", Namespace: local.GetNamespace(), Labels: map[string]string{"tier": "internal-gold"}},
			Data:       map[string][]byte{"password": []byte("pw of " + user), "internal": []byte("not for kcp")},
		}
		if _, err := svc.CoreV1().Secrets(local.GetNamespace()).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	copies := func(want ...string) {
		t.Helper()
		waitFor(t, fmt.Sprintf("copies %v in kcp", want), func(ctx context.Context) (bool, string) {
			list, err := consumer.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{LabelSelector: "ferry.dev/related-identifier=creds"})
			if err != nil {
				return false, err.Error()
			}
			var got []string
			for _, s := range list.Items {
				got = append(got, s.Name)
				user := s.Name[:len(s.Name)-len("-creds")]
				switch {
				case string(s.Data["password"]) != "pw of "+user:
					return false, fmt.Sprintf("%s holds password %q", s.Name, s.Data["password"])
				case s.Data["internal"] != nil:
					return false, fmt.Sprintf("%s still holds the data key the mutation deletes", s.Name)
				case s.Labels["tier"] != "gold" || s.Labels["copied-by"] != "ferry":
					return false, fmt.Sprintf("%s has labels %v, want tier=gold (regex) and copied-by=ferry (CEL)", s.Name, s.Labels)
				}
			}
			slices.Sort(got)
			return slices.Equal(got, want), fmt.Sprintf("copies %v", got)
		})
	}
	copies("alice-creds", "bob-creds")

	// bob leaves the list: his copy goes, alice's stays.
	e.patchRemote(t, "team", `{"users":[{"name":"alice"}]}`)
	copies("alice-creds")

	// The Secrets in the service cluster are the service's: untouched.
	for _, user := range []string{"alice", "bob"} {
		s, err := svc.CoreV1().Secrets(local.GetNamespace()).Get(ctx, user+"-creds", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Labels["tier"] != "internal-gold" || s.Data["internal"] == nil {
			t.Errorf("the service's Secret %s was changed: labels %v", s.Name, s.Labels)
		}
	}
}

// TestInvalidRelatedListOrMutationGetsCondition: a list path ferry cannot
// evaluate (two "#") and a related mutation step that does not compile are
// refused on the PublishedResource's condition (RelatedInvalid), naming
// the field.
func TestInvalidRelatedListOrMutationGetsCondition(t *testing.T) {
	p := newPubEnv(t)
	apply(t, testCRD("badlist.example.com", "Ratchet", "ratchets", "Namespaced", "v1"))
	p.publish(t, "bad-related-list", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: "badlist.example.com", Kind: "Ratchet", Version: "v1"},
		Related: []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "creds", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
			Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.teams.#.users.#.name"}},
		}},
	})
	pr := p.waitCondition(t, "bad-related-list", metav1.ConditionFalse, ferryv1alpha1.ReasonRelatedInvalid)
	if msg := pr.Status.Conditions[0].Message; !strings.Contains(msg, `spec.related[creds]: reference.name.path: path "spec.teams.#.users.#.name" has more than one "#"`) {
		t.Errorf("condition message %q does not name the path", msg)
	}
	apply(t, testCRD("badlist.example.com", "Cog", "cogs", "Namespaced", "v1"))
	p.publish(t, "bad-related-mutation", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: "badlist.example.com", Kind: "Cog", Version: "v1"},
		Related: []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "creds", Origin: ferryv1alpha1.OriginKCP, Kind: "Secret",
			Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
			Mutation: &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{
				{CEL: &ferryv1alpha1.CELMutation{Path: "data.x", Expression: "object.("}},
			}},
		}},
	})
	pr = p.waitCondition(t, "bad-related-mutation", metav1.ConditionFalse, ferryv1alpha1.ReasonRelatedInvalid)
	if msg := pr.Status.Conditions[0].Message; !strings.Contains(msg, "spec.related[creds]: mutation.spec[0].cel") {
		t.Errorf("condition message %q does not name the step", msg)
	}
}

// TestRelatedMutationOfKCPOrigin: a consumer's Secret is mutated on its
// way down (a CEL label, a data key deleted, a regex on a label); the
// copy in the service cluster shows it, and the edge never takes ferry's
// own mutated write for a local edit (no resend asked), while an update
// in kcp still flows down mutated.
func TestRelatedMutationOfKCPOrigin(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "lockbox.example.com", "Lockbox", "lockboxes", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Related = []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "keys", Origin: ferryv1alpha1.OriginKCP, Kind: "Secret",
			Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.keySecret"}},
			Mutation: &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{
				{CEL: &ferryv1alpha1.CELMutation{Path: "metadata.labels.from", Expression: "'kcp'"}},
				{Regex: &ferryv1alpha1.RegexMutation{Path: "metadata.labels.env", Pattern: "^(.*)$", Replacement: `svc-\1`}},
				{Delete: &ferryv1alpha1.DeleteMutation{Path: "data.note"}},
			}},
		}}
	})
	svc := serviceKube(t)
	consumer := e.consumerKube(t)
	if _, err := consumer.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "box-keys", Labels: map[string]string{"env": "prod"}},
		Data:       map[string][]byte{"key": []byte("k1"), "note": []byte("for the consumer only")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.createRemote(t, "default", "box", map[string]any{"keySecret": "box-keys"})
	local := e.waitLocal(t, "default", "box", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	waitCopy := func(key string) {
		t.Helper()
		waitFor(t, "the mutated Secret in the service cluster", func(ctx context.Context) (bool, string) {
			s, err := svc.CoreV1().Secrets(local.GetNamespace()).Get(ctx, "box-keys", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			ok := string(s.Data["key"]) == key && s.Data["note"] == nil && s.Labels["from"] == "kcp" && s.Labels["env"] == "svc-prod"
			return ok, fmt.Sprintf("data %q labels %v", s.Data, s.Labels)
		})
	}
	waitCopy("k1")
	resendsAsked := func() float64 {
		v, _ := scrapeBoth(t, e).broker.Value("ferry_broker_reports_received_total", map[string]string{"export": e.export.String(), "kind": "resend"})
		return v
	}
	resends := resendsAsked()
	s, err := consumer.CoreV1().Secrets("default").Get(ctx, "box-keys", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Data["key"] = []byte("k2")
	if _, err := consumer.CoreV1().Secrets("default").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitCopy("k2")
	if n := resendsAsked() - resends; n != 0 {
		t.Errorf("the edge asked for the mutated related object again %v times after ferry's own writes", n)
	}
	// The consumer's Secret in kcp is untouched by the mutation.
	if s, err = consumer.CoreV1().Secrets("default").Get(ctx, "box-keys", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if s.Labels["env"] != "prod" || s.Labels["from"] != "" || s.Data["note"] == nil {
		t.Errorf("the kcp Secret was changed: labels %v", s.Labels)
	}
}
