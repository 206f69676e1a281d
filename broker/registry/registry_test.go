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
	first := NewSession(Info{ID: "s1", Identity: "edge-a", AgentName: "a", Export: export, ConnectedAt: time.Now()}, func() {})
	second := NewSession(Info{ID: "s2", Identity: "edge-b", AgentName: "b", Export: export, ConnectedAt: time.Now()}, func() {})
	other := NewSession(Info{ID: "s3", Identity: "edge-c", Export: config.APIExportRef{Workspace: "root:org", Name: "other"}}, func() {})

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
	s := NewSession(Info{ID: "s1", Export: config.APIExportRef{Workspace: "root", Name: "x"}}, func() { cancelled++ })
	if _, err := r.Acquire(s); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if cancelled != 1 {
		t.Errorf("cancel called %d times, want 1", cancelled)
	}
	if _, err := r.Acquire(NewSession(Info{ID: "s2"}, func() {})); !errors.Is(err, ErrClosed) {
		t.Errorf("acquire after close: want ErrClosed, got %v", err)
	}
}
