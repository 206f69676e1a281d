package replication

import (
	"errors"
	"strings"
	"testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/edge/objectlog"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// drainInventories returns the inventories Next hands out.
func drainInventories(e *Engine) []*ferryv1.Inventory {
	var out []*ferryv1.Inventory
	for {
		m, ok := e.Next()
		if !ok {
			return out
		}
		if inv := m.GetInventory(); inv != nil {
			out = append(out, inv)
		}
	}
}

func TestRequestInventory(t *testing.T) {
	_, remote := remoteThing()
	cp := localCopy(remote)
	cp.SetAnnotations(map[string]string{naming.AnnotationContentHash: "h1", naming.AnnotationResourceVersion: "5",
		naming.AnnotationNamespace: remote.Namespace, naming.AnnotationName: remote.Name, naming.AnnotationUID: remote.UID})
	cases := []struct {
		name    string
		synced  bool
		prs     []string
		want    int
		wantCpy bool
	}{
		{name: "all resources", synced: true, want: 1, wantCpy: true},
		{name: "named resource", synced: true, prs: []string{"pr"}, want: 1, wantCpy: true},
		{name: "another resource", synced: true, prs: []string{"other"}},
		{name: "not listed yet: sent once listed", synced: false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e, _, _ := testEngine(t, tc.synced, cp)
			drainInventories(e) // the handshake's
			e.RequestInventory(tc.prs)
			got := drainInventories(e)
			if len(got) != tc.want {
				t.Fatalf("%d inventories, want %d: %v", len(got), tc.want, got)
			}
			if !tc.wantCpy {
				return
			}
			inv := got[0]
			if !inv.GetComplete() || inv.GetPublishedResource() != "pr" || len(inv.GetEntries()) != 1 {
				t.Fatalf("inventory %v", inv)
			}
			entry := inv.GetEntries()[0]
			if entry.GetAppliedHash() != "h1" || entry.GetAppliedResourceVersion() != "5" ||
				entry.GetLocalNamespace() != "local-ns" || entry.GetLocalName() != "a-copy" || entry.GetKey().GetUid() != "u-a" {
				t.Errorf("entry %v", entry)
			}
		})
	}
}

// TestEdgeObjectState: the object view reads the engine's copies and the
// log of the intents it handled.
func TestEdgeObjectState(t *testing.T) {
	key, remote := remoteThing()
	remote.WorkspacePath = "root:team"
	cp := localCopy(remote)
	ann := cp.GetAnnotations()
	ann[naming.AnnotationContentHash], ann[naming.AnnotationResourceVersion] = "h1", "5"
	cp.SetAnnotations(ann)
	e, _, _ := testEngine(t, true, cp)
	log := objectlog.New(nil)
	upsertOf := func(k *ferryv1.ObjectKey, hash string) *ferryv1.SyncIntent {
		return &ferryv1.SyncIntent{Key: k, PublishedResource: "pr", Version: &ferryv1.ObjectVersion{Sequence: 3, ResourceVersion: "5"},
			Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: hash}}}
	}
	log.IntentDone(upsertOf(key, "h1"), &ferryv1.IntentResult{Key: key, LocalNamespace: "local-ns", LocalName: "a-copy"})
	bad := &ferryv1.ObjectKey{Cluster: "c1", Resource: key.GetResource(), Namespace: "team", Name: "bad", Uid: "u-bad"}
	in := upsertOf(bad, "h2")
	log.IntentDone(in, nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_REJECTED, false, "denied: fieldV1 may not be forbidden here"))
	gone := &ferryv1.ObjectKey{Cluster: "c1", Resource: key.GetResource(), Namespace: "team", Name: "gone", Uid: "u-gone"}
	log.IntentDone(upsertOf(gone, "h3"), &ferryv1.IntentResult{Key: gone})
	log.IntentDone(&ferryv1.SyncIntent{Key: gone, PublishedResource: "pr", Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}},
		&ferryv1.IntentResult{Key: gone})

	type want struct {
		name, local, errMessage, summary string
		current                          bool
	}
	synced := want{name: "a", local: "local-ns/a-copy", current: true, summary: "local copy local-ns/a-copy"}
	cases := []struct {
		name    string
		q       *ferryv1.EdgeAdminServiceGetObjectStateRequest
		want    want
		wantErr error
	}{
		{name: "by kcp key", want: synced,
			q: &ferryv1.EdgeAdminServiceGetObjectStateRequest{Workspace: "c1", Resource: "things", Namespace: "team", Name: "a"}},
		{name: "by kcp plural.group", want: synced,
			q: &ferryv1.EdgeAdminServiceGetObjectStateRequest{Workspace: "c1", Resource: "things.kcp.example", Namespace: "team", Name: "a"}},
		{name: "by PublishedResource name and workspace path", want: synced,
			q: &ferryv1.EdgeAdminServiceGetObjectStateRequest{Workspace: "root:team", Resource: "pr", Namespace: "team", Name: "a"}},
		{name: "by local copy", want: synced,
			q: &ferryv1.EdgeAdminServiceGetObjectStateRequest{LocalNamespace: "local-ns", LocalName: "a-copy"}},
		{name: "by local copy and local resource", want: synced,
			q: &ferryv1.EdgeAdminServiceGetObjectStateRequest{Resource: "things.svc.example", LocalNamespace: "local-ns", LocalName: "a-copy"}},
		{name: "a failing object has no copy and says why",
			q:    &ferryv1.EdgeAdminServiceGetObjectStateRequest{Workspace: "c1", Resource: "things", Namespace: "team", Name: "bad"},
			want: want{name: "bad", errMessage: "denied: fieldV1 may not be forbidden here", summary: "no local copy; the last intent failed: rejected"}},
		{name: "a deleted object is forgotten", wantErr: objectlog.ErrObjectNotFound,
			q: &ferryv1.EdgeAdminServiceGetObjectStateRequest{Workspace: "c1", Resource: "things", Namespace: "team", Name: "gone"}},
		{name: "unknown object", wantErr: objectlog.ErrObjectNotFound,
			q: &ferryv1.EdgeAdminServiceGetObjectStateRequest{Workspace: "c1", Resource: "things", Namespace: "team", Name: "nope"}},
		{name: "unknown local copy", wantErr: objectlog.ErrObjectNotFound,
			q: &ferryv1.EdgeAdminServiceGetObjectStateRequest{LocalNamespace: "local-ns", LocalName: "nope"}},
		{name: "resource not published", wantErr: objectlog.ErrObjectNotFound,
			q: &ferryv1.EdgeAdminServiceGetObjectStateRequest{Workspace: "c1", Resource: "widgets", Namespace: "team", Name: "a"}},
		{name: "other group", wantErr: objectlog.ErrObjectNotFound,
			q: &ferryv1.EdgeAdminServiceGetObjectStateRequest{Workspace: "c1", Group: "other", Resource: "things", Namespace: "team", Name: "a"}},
		{name: "no selection", wantErr: objectlog.ErrInvalidQuery, q: &ferryv1.EdgeAdminServiceGetObjectStateRequest{Workspace: "c1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := log.ObjectState(e, tc.q)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			local := ""
			if lc := got.GetLocalCopy(); lc != nil {
				local = nsName(lc.GetNamespace(), lc.GetName())
			}
			g := want{name: got.GetKey().GetName(), local: local, errMessage: got.GetLastError().GetError().GetMessage(),
				current: got.GetApplied().GetCurrent(), summary: tc.want.summary}
			if g != tc.want {
				t.Errorf("got %+v, want %+v", g, tc.want)
			}
			if !strings.Contains(got.GetSummary(), tc.want.summary) {
				t.Errorf("summary %q lacks %q", got.GetSummary(), tc.want.summary)
			}
			if got.GetPublishedResource() != "pr" || got.GetLastIntent().GetOperation() != "upsert" || got.GetLastIntent().GetVersion().GetSequence() != 3 {
				t.Errorf("published resource %q, last intent %v", got.GetPublishedResource(), got.GetLastIntent())
			}
		})
	}
	if got, _ := log.ObjectState(e, &ferryv1.EdgeAdminServiceGetObjectStateRequest{LocalNamespace: "local-ns", LocalName: "a-copy"}); got.GetApplied().GetResourceVersion() != "5" ||
		got.GetWorkspacePath() != "root:team" || got.GetKey().GetUid() != "u-a" {
		t.Errorf("copy details: %v", got)
	}

	res := e.Resources()
	if len(res) != 1 || !res[0].GetListed() || res[0].GetObjects() != 1 || res[0].GetRemote().GetGroup() != "kcp.example" || res[0].GetLocal().GetGroup() != "svc.example" {
		t.Errorf("resources %v", res)
	}
	if applied, failed := log.Counts(); applied != 3 || failed != 1 {
		t.Errorf("counts: %d applied, %d failed", applied, failed)
	}
}
