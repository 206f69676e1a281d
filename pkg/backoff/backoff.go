// Package backoff computes reconnect delays: exponential growth with full
// jitter, as recommended for many clients reconnecting to one server.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Exponential yields delays drawn uniformly from [0, min(Max, Initial·2^n)),
// where n counts the failures since the last Reset. Not safe for concurrent
// use; each reconnect loop owns one.
type Exponential struct {
	// Initial is the cap of the first delay. Required, > 0.
	Initial time.Duration
	// Max caps every delay. Required, >= Initial.
	Max time.Duration
	// Rand returns a float in [0,1); nil uses math/rand/v2. Tests inject it.
	Rand func() float64

	attempt int
}

// Next returns the delay before the next attempt and counts the attempt.
func (b *Exponential) Next() time.Duration {
	ceiling := b.Initial
	for i := 0; i < b.attempt && ceiling < b.Max; i++ {
		ceiling *= 2
	}
	if ceiling > b.Max {
		ceiling = b.Max
	}
	b.attempt++
	r := rand.Float64
	if b.Rand != nil {
		r = b.Rand
	}
	return time.Duration(r() * float64(ceiling))
}

// Reset starts over after a connection proved stable.
func (b *Exponential) Reset() { b.attempt = 0 }
