package publish

import (
	"testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

func pub(name, rev string) *ferryv1.Publish {
	return &ferryv1.Publish{PublishedResource: name, Revision: rev, Spec: []byte("{}"), CustomResourceDefinition: []byte("{}")}
}

// sent summarises Outgoing as "publish:name@rev" / "unpublish:name".
func sent(s *Store) []string {
	var out []string
	for _, m := range s.Outgoing() {
		switch {
		case m.GetPublish() != nil:
			out = append(out, "publish:"+m.GetPublish().GetPublishedResource()+"@"+m.GetPublish().GetRevision())
		case m.GetUnpublish() != nil:
			out = append(out, "unpublish:"+m.GetUnpublish().GetPublishedResource())
		}
	}
	return out
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestStoreSendsLatestAndResendsAfterReconnect(t *testing.T) {
	hello := &ferryv1.BrokerHello{Export: &ferryv1.ExportStatus{Export: &ferryv1.APIExportReference{Name: "g.example.com", WorkspacePath: "root:x"}}}
	steps := []struct {
		name string
		do   func(s *Store)
		want []string
	}{
		{name: "nothing is sent while disconnected", do: func(s *Store) { s.Set(pub("b", "1")); s.Set(pub("a", "1")) }, want: nil},
		{name: "connect sends everything, in name order", do: func(s *Store) { s.Attach(hello) }, want: []string{"publish:a@1", "publish:b@1"}},
		{name: "an identical Set is not sent again", do: func(s *Store) { s.Set(pub("a", "1")) }, want: nil},
		{name: "latest wins", do: func(s *Store) { s.Set(pub("a", "2")); s.Set(pub("a", "3")) }, want: []string{"publish:a@3"}},
		{name: "remove sends Unpublish", do: func(s *Store) { s.Remove("b") }, want: []string{"unpublish:b"}},
		{name: "removing the unknown sends nothing", do: func(s *Store) { s.Remove("zzz") }, want: nil},
		{name: "after a reconnect only what is desired is re-sent", do: func(s *Store) { s.Detach(); s.Attach(hello) }, want: []string{"publish:a@3"}},
	}
	s := NewStore("broker:9443", func() {})
	for _, st := range steps {
		st.do(s)
		if got := sent(s); !equal(got, st.want) {
			t.Fatalf("%s: sent %v, want %v", st.name, got, st.want)
		}
	}
	if got := s.Status("a"); !got.Connected || got.ExportName != "g.example.com" || got.ExportWorkspace != "root:x" {
		t.Errorf("status %+v", got)
	}
}

func TestStoreResults(t *testing.T) {
	s := NewStore("broker:9443", func() {})
	s.Attach(&ferryv1.BrokerHello{})
	s.Set(pub("a", "1"))
	result := func(name string) *ferryv1.ConnectResponse {
		return &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_PublishResult{PublishResult: &ferryv1.PublishResult{
			PublishedResource: name, Revision: "1", State: ferryv1.PublishState_PUBLISH_STATE_PUBLISHED,
		}}}
	}
	if err := s.Handle(result("a")); err != nil {
		t.Fatal(err)
	}
	if r := s.Status("a").Result; r.GetRevision() != "1" {
		t.Fatalf("result not stored: %v", r)
	}
	// A result for something withdrawn meanwhile is dropped.
	if err := s.Handle(result("gone")); err != nil || s.Status("gone").Result != nil {
		t.Fatalf("result for an unknown PublishedResource kept: %v", err)
	}
	s.Remove("a")
	if s.Status("a").Result != nil {
		t.Error("result survived Remove")
	}
	// Messages that are not about publishing are not the store's.
	if err := s.Handle(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Intent{Intent: &ferryv1.SyncIntent{}}}); err == nil {
		t.Error("the store accepted a sync intent")
	}
}

func TestWakesOnlyWhenConnected(t *testing.T) {
	woken := 0
	s := NewStore("b", func() { woken++ })
	s.Set(pub("a", "1"))
	if woken != 0 {
		t.Fatal("woken while disconnected")
	}
	s.Attach(&ferryv1.BrokerHello{})
	if woken == 0 {
		t.Fatal("not woken after connect")
	}
}

func TestStoreTooLarge(t *testing.T) {
	s := NewStore("b", func() {})
	s.Attach(&ferryv1.BrokerHello{})
	s.Set(pub("big", "1"))
	msgs := s.Outgoing()
	s.TooLarge(msgs[0], 5000, 4000)
	r := s.Status("big").Result
	if r.GetState() != ferryv1.PublishState_PUBLISH_STATE_FAILED || r.GetReason() != "TooLarge" || r.GetRevision() != "1" {
		t.Fatalf("oversized publish not recorded as failed: %v", r)
	}
	// A newer revision is not marked by a report about an older one.
	s.Set(pub("big", "2"))
	s.TooLarge(msgs[0], 5000, 4000)
	if s.Status("big").Result.GetRevision() != "1" {
		t.Fatal("stale TooLarge report overwrote state")
	}
}
