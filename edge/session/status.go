package session

import (
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// LinkStatus is the broker link as the handler saw it, for the edge's admin
// view.
type LinkStatus struct {
	// Connected tells whether a stream is established.
	Connected bool
	// Since is when it was established, or when the last one ended; zero
	// before the first.
	Since time.Time
	// Hello is the current (or last) stream's BrokerHello; nil before the
	// first.
	Hello *ferryv1.BrokerHello
	// Export is the APIExport's state as the broker last said.
	Export *ferryv1.ExportStatus
}

// linkState records the link for LinkStatus; the zero value is ready.
type linkState struct {
	mu     sync.Mutex
	status LinkStatus
}

func (l *linkState) connected(hello *ferryv1.BrokerHello) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.status = LinkStatus{Connected: true, Since: time.Now(), Hello: hello, Export: hello.GetExport()}
}

func (l *linkState) disconnected() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.status.Connected, l.status.Since = false, time.Now()
}

func (l *linkState) exportChanged(st *ferryv1.ExportStatus) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.status.Export = st
}

// Link returns the broker link's state. The messages are copies.
func (h *Handler) Link() LinkStatus {
	h.link.mu.Lock()
	defer h.link.mu.Unlock()
	st := h.link.status
	if st.Hello != nil {
		st.Hello = proto.CloneOf(st.Hello)
	}
	if st.Export != nil {
		st.Export = proto.CloneOf(st.Export)
	}
	return st
}
