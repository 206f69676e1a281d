package framework

import (
	"context"
	"fmt"
	"time"
)

// Eventually calls check every interval until it reports done, ctx ends or
// timeout passes. check returns done and, when not done, why it is still
// waiting; the last reason is part of the timeout error, so a failure says
// what never happened.
func Eventually(ctx context.Context, timeout, interval time.Duration, check func(ctx context.Context) (done bool, reason string)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(interval)
	defer t.Stop()
	var reason string
	for {
		done, r := check(ctx)
		if done {
			return nil
		}
		reason = r
		select {
		case <-ctx.Done():
			return fmt.Errorf("still waiting after %s: %s", timeout, reason)
		case <-t.C:
		}
	}
}
