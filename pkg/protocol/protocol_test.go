package protocol

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

func TestNegotiateVersion(t *testing.T) {
	tests := []struct {
		peer    uint32
		want    uint32
		wantErr bool
	}{
		{peer: 0, wantErr: true},
		{peer: Version, want: Version},
		{peer: Version + 1, want: Version},
		{peer: Version + 2, wantErr: true},
	}
	for _, tt := range tests {
		got, err := NegotiateVersion(tt.peer)
		if tt.wantErr {
			if !errors.Is(err, ErrVersionSkew) {
				t.Errorf("peer %d: want ErrVersionSkew, got %v", tt.peer, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("peer %d: got %d, %v; want %d", tt.peer, got, err, tt.want)
		}
	}
}

func TestIntersectCapabilities(t *testing.T) {
	got := IntersectCapabilities([]ferryv1.Capability{
		ferryv1.Capability_CAPABILITY_INVENTORY_RESYNC,
		ferryv1.Capability(99), // unknown to this build
		ferryv1.Capability_CAPABILITY_STATUS,
	})
	want := []ferryv1.Capability{ferryv1.Capability_CAPABILITY_STATUS, ferryv1.Capability_CAPABILITY_INVENTORY_RESYNC}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestNegotiateHeartbeat(t *testing.T) {
	if got := NegotiateHeartbeat(2*time.Second, 5*time.Second); got != 5*time.Second {
		t.Errorf("got %v, want the longer interval", got)
	}
	if got := NegotiateHeartbeat(0, 0); got != MinHeartbeatInterval {
		t.Errorf("got %v, want the minimum", got)
	}
}

func TestValidateEdgeHello(t *testing.T) {
	valid := func() *ferryv1.EdgeHello {
		return &ferryv1.EdgeHello{
			ProtocolVersion:        Version,
			AgentName:              "nora",
			MaxReceiveMessageBytes: DefaultMaxMessageBytes,
			HeartbeatInterval:      durationpb.New(10 * time.Second),
		}
	}
	tests := []struct {
		name    string
		mutate  func(h *ferryv1.EdgeHello) *ferryv1.EdgeHello
		wantErr []string
	}{
		{name: "valid", mutate: func(h *ferryv1.EdgeHello) *ferryv1.EdgeHello { return h }},
		{name: "nil", mutate: func(*ferryv1.EdgeHello) *ferryv1.EdgeHello { return nil }, wantErr: []string{"must be an EdgeHello"}},
		{
			name: "everything wrong at once",
			mutate: func(h *ferryv1.EdgeHello) *ferryv1.EdgeHello {
				h.ProtocolVersion, h.AgentName, h.MaxReceiveMessageBytes, h.HeartbeatInterval = 0, "Not_A_Label", 10, nil
				return h
			},
			wantErr: []string{"protocol_version", "agent_name", "max_receive_message_bytes", "heartbeat_interval"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ValidateEdgeHello(tt.mutate(valid()))
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestIntentKeys(t *testing.T) {
	obj := &ferryv1.ObjectKey{Cluster: "c", Resource: &ferryv1.GroupVersionResource{Group: "g", Version: "v1", Resource: "things"}, Namespace: "ns", Name: "n", Uid: "u"}
	if got := ObjectKeyString(obj); got != "c|g/things|ns|n|u" {
		t.Errorf("ObjectKeyString = %q", got)
	}
	if IntentKey(obj, nil) != ObjectKeyString(obj) {
		t.Error("a primary's intent key is not its object key")
	}
	secret := &ferryv1.ObjectKey{Cluster: "c", Resource: &ferryv1.GroupVersionResource{Version: "v1", Resource: "secrets"}, Namespace: "ns", Name: "s"}
	a := IntentKey(secret, &ferryv1.RelatedTo{Primary: obj, Identifier: "creds"})
	b := IntentKey(&ferryv1.ObjectKey{Name: "elsewhere"}, &ferryv1.RelatedTo{Primary: obj, Identifier: "creds"})
	if a != b || a == IntentKey(secret, &ferryv1.RelatedTo{Primary: obj, Identifier: "config"}) || a == IntentKey(obj, nil) {
		t.Errorf("related intent keys must be one per primary and entry: %q %q", a, b)
	}
}
