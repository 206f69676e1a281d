package registry

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/broker/config"
)

func TestRegistryOneEdgePerExport(t *testing.T) {
	r := NewRegistry()
	export := config.APIExportRef{Workspace: "root:org", Name: "demo.ferry.dev"}
	first := NewSession(Info{ID: "s1", Identity: "edge-a", AgentName: "a", Export: export, ConnectedAt: time.Now()}, func(error) {})
	second := NewSession(Info{ID: "s2", Identity: "edge-b", AgentName: "b", Export: export, ConnectedAt: time.Now()}, func(error) {})
	other := NewSession(Info{ID: "s3", Identity: "edge-c", Export: config.APIExportRef{Workspace: "root:org", Name: "other"}}, func(error) {})

	release, err := r.Acquire(first)
	if err != nil {
		t.Fatalf("first acquire: %v", err)
	}
	_, err = r.Acquire(second)
	var held *HeldError
	if !errors.As(err, &held) || held.Holder != first {
		t.Fatalf("second acquire: want HeldError naming the first session, got %v", err)
	}
	if !strings.Contains(err.Error(), `"edge-a"`) || !strings.Contains(err.Error(), "root:org/demo.ferry.dev") {
		t.Errorf("message should name the holder and the export: %v", err)
	}
	if _, err := r.Acquire(other); err != nil {
		t.Fatalf("another export is independent: %v", err)
	}

	release()
	release() // idempotent
	if _, err := r.Acquire(second); err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
	if s, ok := r.ForExport(export); !ok || s != second {
		t.Errorf("ForExport = %v, %v; want the second session", s, ok)
	}
}

func TestRegistryCloseEndsSessions(t *testing.T) {
	r := NewRegistry()
	cancelled := 0
	s := NewSession(Info{ID: "s1", Export: config.APIExportRef{Workspace: "root", Name: "x"}}, func(error) { cancelled++ })
	if _, err := r.Acquire(s); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if cancelled != 1 {
		t.Errorf("cancel called %d times, want 1", cancelled)
	}
	if _, err := r.Acquire(NewSession(Info{ID: "s2"}, func(error) {})); !errors.Is(err, ErrClosed) {
		t.Errorf("acquire after close: want ErrClosed, got %v", err)
	}
}

func TestRegistryEndsMatchingSessionsWithCause(t *testing.T) {
	cause := errors.New("revoked")
	tests := []struct {
		name  string
		match func(*Session) bool
		want  []string
	}{
		{name: "by certificate", match: func(s *Session) bool { return s.CertificateSHA256 == "sha256:aa" }, want: []string{"s1"}},
		{name: "by identity", match: func(s *Session) bool { return s.Identity == "edge-b" }, want: []string{"s2"}},
		{name: "none", match: func(*Session) bool { return false }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := NewRegistry()
			ended := map[string]error{}
			for _, info := range []Info{
				{ID: "s1", Identity: "edge-a", CertificateSHA256: "sha256:aa", Export: config.APIExportRef{Workspace: "root", Name: "a"}},
				{ID: "s2", Identity: "edge-b", CertificateSHA256: "sha256:bb", Export: config.APIExportRef{Workspace: "root", Name: "b"}},
			} {
				if _, err := r.Acquire(NewSession(info, func(err error) { ended[info.ID] = err })); err != nil {
					t.Fatal(err)
				}
			}
			if n := r.End(tc.match, cause); n != len(tc.want) {
				t.Errorf("End = %d, want %d", n, len(tc.want))
			}
			if len(ended) != len(tc.want) {
				t.Fatalf("ended %v, want %v", ended, tc.want)
			}
			for _, id := range tc.want {
				if ended[id] != cause {
					t.Errorf("session %s ended with %v, want the cause", id, ended[id])
				}
			}
		})
	}
}
