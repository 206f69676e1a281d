package replication

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	k8stypes "k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// syncAgentMarks labels and annotates u as api-syncagent agent's copy of r.
func syncAgentMarks(u *unstructured.Unstructured, agent string, r naming.Remote) {
	l := map[string]string{saLabelAgent: agent, saLabelCluster: r.ClusterName, saLabelNameHash: saHash(r.Name), "app": "db"}
	ann := map[string]string{saAnnotationName: r.Name}
	if r.Namespace != "" {
		l[saLabelNamespaceHash] = saHash(r.Namespace)
		ann[saAnnotationNS] = r.Namespace
	}
	u.SetLabels(l)
	u.SetAnnotations(ann)
}

// conflictsWritten returns status.objects.conflicting of the last status
// write of the PublishedResource, and whether there was one.
func conflictsWritten(t *testing.T, e *Engine) (int64, bool) {
	t.Helper()
	_, objects, written := lastStatusWrite(t, e)
	f, _ := objects["conflicting"].(float64) // encoding/json's number
	return int64(f), written
}

// events returns the Events recorded in the typed client.
func events(t *testing.T, e *Engine) []corev1.Event {
	t.Helper()
	list, err := e.opts.Kube.(*kubefake.Clientset).CoreV1().Events("").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// TestConflictPolicy: an object ferry did not create at the place of a kcp
// object's copy is refused (Fail, the default) or taken over in place
// (Adopt: same UID, recorded on it); Adopt never takes ferry's copy of
// another object, api-syncagent's copy of another object, an object being
// deleted, or one in a namespace the edge may not write.
func TestConflictPolicy(t *testing.T) {
	key, remote := remoteThing()
	other := naming.Remote{ClusterName: "c2", Namespace: "team", Name: "a", UID: "u-other"}
	unmarked := func(t *testing.T) *unstructured.Unstructured {
		return atTarget(t, remote, func(u *unstructured.Unstructured) { u.SetLabels(map[string]string{"app": "db"}) })
	}
	for _, tc := range []struct {
		name    string
		policy  ferryv1alpha1.ConflictPolicy
		present func(t *testing.T) *unstructured.Unstructured
		// sameNamespace: the naming rule puts the copy into the kcp
		// object's namespace, "team", which exists and ferry did not make.
		sameNamespace, allowExisting bool
		// want: "adopt", "conflict" or "forbidden".
		want     string
		wantFrom ferryv1.AdoptedFrom
	}{
		{name: "Fail (the default) refuses an object ferry did not create", present: unmarked, want: "conflict"},
		{name: "explicit Fail", policy: ferryv1alpha1.ConflictPolicyFail, present: unmarked, want: "conflict"},
		{name: "Adopt takes it over", policy: ferryv1alpha1.ConflictPolicyAdopt, present: unmarked, want: "adopt"},
		{name: "Adopt takes api-syncagent's copy of this very object (its finalizer is swapped)", policy: ferryv1alpha1.ConflictPolicyAdopt,
			present: func(t *testing.T) *unstructured.Unstructured {
				return atTarget(t, remote, func(u *unstructured.Unstructured) { syncAgentMarks(u, "sa", remote) })
			}, want: "adopt", wantFrom: ferryv1.AdoptedFrom_ADOPTED_FROM_API_SYNCAGENT},
		{name: "Adopt never takes api-syncagent's copy of another object", policy: ferryv1alpha1.ConflictPolicyAdopt,
			present: func(t *testing.T) *unstructured.Unstructured {
				return atTarget(t, remote, func(u *unstructured.Unstructured) { syncAgentMarks(u, "sa", other) })
			}, want: "conflict"},
		{name: "Adopt never takes ferry's copy of another workspace's object", policy: ferryv1alpha1.ConflictPolicyAdopt,
			present: func(t *testing.T) *unstructured.Unstructured {
				return atTarget(t, remote, func(u *unstructured.Unstructured) {
					u.SetLabels(naming.Labels("nora", other))
					u.SetAnnotations(naming.Annotations(other))
				})
			}, want: "conflict"},
		{name: "Adopt never takes ferry's copy of another kcp resource", policy: ferryv1alpha1.ConflictPolicyAdopt,
			present: func(t *testing.T) *unstructured.Unstructured {
				return atTarget(t, remote, func(u *unstructured.Unstructured) {
					u.SetLabels(map[string]string{naming.LabelRemoteResource: "others.kcp.example"})
				})
			}, want: "conflict"},
		{name: "Adopt never takes an object being deleted", policy: ferryv1alpha1.ConflictPolicyAdopt,
			present: func(t *testing.T) *unstructured.Unstructured {
				u := unmarked(t)
				now := metav1.Now()
				u.SetDeletionTimestamp(&now)
				u.SetFinalizers([]string{"svc.example/keep"})
				return u
			}, want: "conflict"},
		{name: "Adopt never takes an object in a namespace the edge may not write", policy: ferryv1alpha1.ConflictPolicyAdopt, sameNamespace: true,
			present: func(t *testing.T) *unstructured.Unstructured {
				u := unmarked(t)
				u.SetNamespace("team")
				return u
			}, want: "forbidden"},
		{name: "Adopt in a namespace allowExistingNamespaces admits", policy: ferryv1alpha1.ConflictPolicyAdopt, sameNamespace: true, allowExisting: true,
			present: func(t *testing.T) *unstructured.Unstructured {
				u := unmarked(t)
				u.SetNamespace("team")
				return u
			}, want: "adopt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			present := tc.present(t)
			e, _, sink := testEngineWith(t, engineSetup{
				kubeObjs: []runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}},
				published: func(p *Published) {
					p.ConflictPolicy = tc.policy
					p.AllowExistingNamespaces = tc.allowExisting
					if tc.sameNamespace {
						rules, err := naming.Compile(&ferryv1alpha1.ResourceNaming{Namespace: naming.PlaceholderNamespace, AllowExistingNamespaces: tc.allowExisting})
						if err != nil {
							t.Fatal(err)
						}
						p.Naming = rules
					}
				},
			}, present)
			acceptApplies(e)
			e.Handle(upsertOf(key, 2, "h1", thingA))
			runQueue(t, e)
			var res *ferryv1.IntentResult
			for _, m := range sink.msgs {
				if r := m.GetIntentResult(); r != nil {
					res = r
				}
			}
			if res == nil {
				t.Fatalf("no answer: %v", sink.msgs)
			}
			p := patches(t, e)
			if deletes(e) != 0 {
				t.Fatal("deleted an object")
			}
			switch tc.want {
			case "adopt":
				if res.GetError() != nil || len(p) != 1 {
					t.Fatalf("answer %v, %d applies: want the object adopted by one apply", res, len(p))
				}
				if p[0].GetUID() != present.GetUID() || p[0].GetNamespace() != present.GetNamespace() || p[0].GetName() != present.GetName() {
					t.Fatalf("applied %s/%s uid %q: want the object in place, its UID as precondition", p[0].GetNamespace(), p[0].GetName(), p[0].GetUID())
				}
				ann := p[0].GetAnnotations()
				if ann[annotationAdoptedAt] == "" || ann[annotationAdoptedFrom] == "" || ann[naming.AnnotationUID] != "u-a" {
					t.Fatalf("annotations %v: want the adoption and the kcp object recorded", ann)
				}
				if res.GetAdoptedFrom() != tc.wantFrom {
					t.Fatalf("adopted_from %v, want %v", res.GetAdoptedFrom(), tc.wantFrom)
				}
				ev := events(t, e)
				if len(ev) != 1 || ev[0].Reason != "Adopted" || ev[0].InvolvedObject.UID != present.GetUID() {
					t.Fatalf("want one Adopted Event on the object, got %v", ev)
				}
			case "conflict", "forbidden":
				reason := ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT
				if tc.want == "forbidden" {
					reason = ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN
				}
				if res.GetError().GetReason() != reason || res.GetError().GetRetryable() {
					t.Fatalf("answer %v: want a final %v", res, reason)
				}
				if len(p) != 0 {
					t.Fatalf("%d writes to an object ferry may not take", len(p))
				}
				if len(events(t, e)) != 0 {
					t.Fatal("an Event for an adoption that did not happen")
				}
			}
			n, written := conflictsWritten(t, e)
			if tc.want == "conflict" && (!written || n != 1) {
				t.Fatalf("status.objects.conflicting = %d (written %v), want 1", n, written)
			}
			if tc.want != "conflict" && n != 0 {
				t.Fatalf("status.objects.conflicting = %d, want 0", n)
			}
		})
	}
}

// TestAdoptionIsKeptOnLaterApplies: the adoption annotations stay on the
// copy when the kcp object changes (the edge's field manager owns them; an
// apply without them would remove them), and every ack of an adopted
// api-syncagent copy says so (a lost ack is repeated).
func TestAdoptionIsKeptOnLaterApplies(t *testing.T) {
	key, remote := remoteThing()
	cp := localCopy(remote)
	ann := cp.GetAnnotations()
	ann[annotationAdoptedAt] = "2026-01-02T03:04:05Z"
	ann[annotationAdoptedFrom] = adoptedFromAPISyncAgentPrefix + "sa"
	cp.SetAnnotations(ann)
	e, _, sink := testEngine(t, true, cp)
	acceptApplies(e)
	e.Handle(upsertOf(key, 2, "h2", thingA))
	runQueue(t, e)
	p := patches(t, e)
	if len(sink.msgs) != 1 || sink.msgs[0].GetIntentResult().GetError() != nil || len(p) != 1 {
		t.Fatalf("want one apply and one ack, got %v", sink.msgs)
	}
	got := p[0].GetAnnotations()
	if got[annotationAdoptedAt] != "2026-01-02T03:04:05Z" || got[annotationAdoptedFrom] != "api-syncagent/sa" {
		t.Fatalf("the adoption record was not carried on: %v", got)
	}
	if sink.msgs[0].GetIntentResult().GetAdoptedFrom() != ferryv1.AdoptedFrom_ADOPTED_FROM_API_SYNCAGENT {
		t.Fatal("the ack does not say the copy was api-syncagent's")
	}
	if len(events(t, e)) != 0 {
		t.Fatal("an Event for an adoption that happened before")
	}
}

// syncAgentState returns api-syncagent's state Secret of the kcp object
// obj (JSON) of workspace c1, in namespace ns, with labels changed by set.
func syncAgentState(t *testing.T, ns, obj string, set func(map[string]string)) *corev1.Secret {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := json.Unmarshal([]byte(obj), &u.Object); err != nil {
		t.Fatal(err)
	}
	name, err := syncAgentStateName("c1", u)
	if err != nil {
		t.Fatal(err)
	}
	l := map[string]string{saLabelState: "true", saLabelCluster: "c1", saLabelNameHash: saHash(u.GetName()), saLabelNamespaceHash: saHash(u.GetNamespace())}
	if set != nil {
		set(l)
	}
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: l, UID: "state-uid"}}
}

// TestAdoptSyncAgentCopies: with spec.adopt, api-syncagent's copy of
// exactly the kcp object (its agent, workspace, namespace and name) is
// taken over where it is, with its UID; its state Secret goes only when it
// provably is that object's; anything short of proof is not adopted.
func TestAdoptSyncAgentCopies(t *testing.T) {
	key, remote := remoteThing()
	other := naming.Remote{ClusterName: "c1", Namespace: "team", Name: "b"}
	saCopy := func(name, agent string, r naming.Remote) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "svc.example/v1", "kind": "Thing", "spec": map[string]any{"x": "0", "size": "10Gi"}}}
		u.SetNamespace("sa-ns")
		u.SetName(name)
		u.SetUID(k8stypes.UID(testUID(name)))
		syncAgentMarks(u, agent, r)
		return u
	}
	for _, tc := range []struct {
		name           string
		objs           []runtime.Object
		state          *corev1.Secret
		stateNamespace string
		allowExisting  bool
		// wantAdopted: the name of the copy adopted ("": none; a new copy
		// is made at ferry's place unless wantError).
		wantAdopted string
		wantError   ferryv1.ApplyErrorReason
		// wantStateGone: the state Secret is deleted.
		wantStateGone bool
	}{
		{name: "its copy is adopted where it is, its state Secret deleted", objs: []runtime.Object{saCopy("x1", "sa", remote)},
			state: syncAgentState(t, "sa-system", thingA, nil), stateNamespace: "sa-system", allowExisting: true,
			wantAdopted: "x1", wantStateGone: true},
		{name: "without stateNamespace no Secret is deleted", objs: []runtime.Object{saCopy("x1", "sa", remote)},
			state: syncAgentState(t, "sa-system", thingA, nil), allowExisting: true, wantAdopted: "x1"},
		{name: "a Secret of that name whose labels name another object stays", objs: []runtime.Object{saCopy("x1", "sa", remote)},
			state:          syncAgentState(t, "sa-system", thingA, func(l map[string]string) { l[saLabelNameHash] = saHash("b") }),
			stateNamespace: "sa-system", allowExisting: true, wantAdopted: "x1"},
		{name: "a Secret of that name without the state label stays", objs: []runtime.Object{saCopy("x1", "sa", remote)},
			state:          syncAgentState(t, "sa-system", thingA, func(l map[string]string) { delete(l, saLabelState) }),
			stateNamespace: "sa-system", allowExisting: true, wantAdopted: "x1"},
		{name: "another agent's copy is not adopted", objs: []runtime.Object{saCopy("x1", "other-agent", remote)}, allowExisting: true},
		{name: "a copy of another object is not adopted", objs: []runtime.Object{saCopy("x1", "sa", other)}, allowExisting: true},
		{name: "a copy whose hash labels contradict its annotations is not adopted", allowExisting: true,
			objs: []runtime.Object{func() runtime.Object {
				u := saCopy("x1", "sa", remote)
				l := u.GetLabels()
				l[saLabelNamespaceHash] = saHash("elsewhere")
				u.SetLabels(l)
				return u
			}()}},
		{name: "two copies of one object: which is its copy is not provable", allowExisting: true,
			objs:      []runtime.Object{saCopy("x1", "sa", remote), saCopy("x2", "sa", remote)},
			wantError: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT},
		{name: "a namespace ferry may not write: not adopted", objs: []runtime.Object{saCopy("x1", "sa", remote)},
			state: syncAgentState(t, "sa-system", thingA, nil), stateNamespace: "sa-system",
			wantError: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kubeObjs := []runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "sa-ns"}}}
			if tc.state != nil {
				kubeObjs = append(kubeObjs, tc.state)
			}
			e, _, sink := testEngineWith(t, engineSetup{kubeObjs: kubeObjs, published: func(p *Published) {
				p.Adopt = &ferryv1alpha1.AdoptSpec{From: ferryv1alpha1.AdoptFromAPISyncAgent, AgentName: "sa", StateNamespace: tc.stateNamespace}
				p.AllowExistingNamespaces = tc.allowExisting
			}}, tc.objs...)
			acceptApplies(e)
			e.Handle(upsertOf(key, 2, "h1", thingA))
			runQueue(t, e)
			if len(sink.msgs) != 1 {
				t.Fatalf("want one answer, got %v", sink.msgs)
			}
			res := sink.msgs[0].GetIntentResult()
			p := patches(t, e)
			if deletes(e) != 0 {
				t.Fatal("deleted a local object")
			}
			switch {
			case tc.wantError != ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_UNSPECIFIED:
				if res.GetError().GetReason() != tc.wantError || res.GetError().GetRetryable() {
					t.Fatalf("answer %v: want a final %v", res, tc.wantError)
				}
				if len(p) != 0 {
					t.Fatalf("%d applies, want none", len(p))
				}
			case tc.wantAdopted != "":
				if res.GetError() != nil || len(p) != 1 {
					t.Fatalf("answer %v, %d applies: want one", res, len(p))
				}
				if p[0].GetNamespace() != "sa-ns" || p[0].GetName() != tc.wantAdopted || string(p[0].GetUID()) != string(testUID(tc.wantAdopted)) {
					t.Fatalf("applied %s/%s uid %s: want api-syncagent's copy in place", p[0].GetNamespace(), p[0].GetName(), p[0].GetUID())
				}
				if res.GetAdoptedFrom() != ferryv1.AdoptedFrom_ADOPTED_FROM_API_SYNCAGENT || res.GetLocalNamespace() != "sa-ns" {
					t.Fatalf("answer %v: want adopted_from api-syncagent and the copy's place", res)
				}
				if got := p[0].GetAnnotations()[annotationAdoptedFrom]; got != "api-syncagent/sa" {
					t.Fatalf("adopted-from %q", got)
				}
			default:
				if res.GetError() != nil || len(p) != 1 || p[0].GetNamespace() == "sa-ns" || p[0].GetUID() != "" {
					t.Fatalf("answer %v, applies %v: want a new copy at ferry's place", res, p)
				}
				if res.GetAdoptedFrom() != ferryv1.AdoptedFrom_ADOPTED_FROM_UNSPECIFIED {
					t.Fatal("a new copy reported as adopted")
				}
			}
			if tc.state != nil {
				_, err := e.opts.Kube.CoreV1().Secrets(tc.state.Namespace).Get(context.Background(), tc.state.Name, metav1.GetOptions{})
				if gone := err != nil; gone != tc.wantStateGone {
					t.Fatalf("state Secret gone: %v (%v), want %v", gone, err, tc.wantStateGone)
				}
			}
		})
	}
}

// testUID is a test UID derived from a name.
func testUID(name string) string { return "uid-" + strings.ToLower(name) }

// TestDeleteOfAnUnadoptedSyncAgentCopy: a kcp object deleted before its
// api-syncagent copy was adopted (the broker asks because the object still
// carries api-syncagent's finalizer): with spec.adopt, api-syncagent's copy
// of exactly that object is deleted (its UID as precondition) and the
// deletion confirmed once it is gone; another agent's copy, or copies
// whose ownership is not provable, are never deleted (the deletion is
// confirmed: they stay for a person).
func TestDeleteOfAnUnadoptedSyncAgentCopy(t *testing.T) {
	key, remote := remoteThing()
	saCopy := func(name, agent string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "svc.example/v1", "kind": "Thing"}}
		u.SetNamespace("sa-ns")
		u.SetName(name)
		u.SetUID(k8stypes.UID(testUID(name)))
		syncAgentMarks(u, agent, remote)
		return u
	}
	for _, tc := range []struct {
		name        string
		adopt       bool
		objs        []runtime.Object
		wantDeleted int
	}{
		{name: "its copy, adopting: deleted", adopt: true, objs: []runtime.Object{saCopy("x1", "sa")}, wantDeleted: 1},
		{name: "its copy, not adopting: left", objs: []runtime.Object{saCopy("x1", "sa")}},
		{name: "another agent's copy: left", adopt: true, objs: []runtime.Object{saCopy("x1", "other")}},
		{name: "two copies, not provable: both left", adopt: true, objs: []runtime.Object{saCopy("x1", "sa"), saCopy("x2", "sa")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, _, sink := testEngineWith(t, engineSetup{published: func(p *Published) {
				if tc.adopt {
					p.Adopt = &ferryv1alpha1.AdoptSpec{From: ferryv1alpha1.AdoptFromAPISyncAgent, AgentName: "sa"}
				}
			}}, tc.objs...)
			e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 3}, PublishedResource: "pr",
				Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}})
			runQueue(t, e)
			if len(sink.msgs) != 1 || sink.msgs[0].GetIntentResult().GetError() != nil {
				t.Fatalf("want the delete acked, got %v", sink.msgs)
			}
			if n := deletes(e); n != tc.wantDeleted {
				t.Fatalf("%d deletes, want %d", n, tc.wantDeleted)
			}
			for _, a := range e.opts.Dynamic.(*dynamicfake.FakeDynamicClient).Actions() {
				if d, ok := a.(k8stesting.DeleteAction); ok {
					if p := d.GetDeleteOptions().Preconditions; p == nil || p.UID == nil || string(*p.UID) != testUID("x1") {
						t.Fatalf("delete without the copy's UID as precondition: %+v", d.GetDeleteOptions())
					}
				}
			}
			got := reportsQueued(e)
			if len(got) != 1 || got[0].GetDeletionConfirmation() == nil {
				t.Fatalf("want the deletion confirmed, got %v", got)
			}
		})
	}
}
