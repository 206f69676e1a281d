package watching

import (
	"testing"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"
)

func TestWithoutWatchList(t *testing.T) {
	lw := &cache.ListWatch{}
	if watchlist.DoesClientNotSupportWatchListSemantics(lw) {
		t.Fatal("a plain ListWatch already opts out: the test shows nothing")
	}
	if !watchlist.DoesClientNotSupportWatchListSemantics(WithoutWatchList(lw)) {
		t.Fatal("the reflector would still stream the initial state (watch-list)")
	}
	if _, ok := WithoutWatchList(lw).(cache.ListerWatcherWithContext); !ok {
		t.Fatal("the context-aware list and watch are lost")
	}
}
