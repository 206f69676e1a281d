package backoff

import (
	"testing"
	"time"
)

func TestExponentialCeilings(t *testing.T) {
	tests := []struct {
		name     string
		initial  time.Duration
		max      time.Duration
		attempts int
		want     []time.Duration // delays with Rand() == 0.999999
	}{
		{
			name: "doubles up to max", initial: 100 * time.Millisecond, max: time.Second, attempts: 6,
			want: []time.Duration{100, 200, 400, 800, 1000, 1000},
		},
		{
			name: "max below initial caps at max", initial: time.Second, max: 500 * time.Millisecond, attempts: 2,
			want: []time.Duration{500, 500},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &Exponential{Initial: tt.initial, Max: tt.max, Rand: func() float64 { return 0.999999 }}
			for i := 0; i < tt.attempts; i++ {
				got := b.Next()
				want := tt.want[i] * time.Millisecond
				// full jitter with r≈1 is just below the ceiling
				if got > want || got < want*999/1000 {
					t.Fatalf("attempt %d: got %v, want just below %v", i, got, want)
				}
			}
		})
	}
}

func TestExponentialFullJitterAndReset(t *testing.T) {
	b := &Exponential{Initial: time.Second, Max: 8 * time.Second, Rand: func() float64 { return 0 }}
	for i := 0; i < 5; i++ {
		if d := b.Next(); d != 0 {
			t.Fatalf("full jitter with r=0 must give 0, got %v", d)
		}
	}
	b.Rand = func() float64 { return 0.5 }
	b.Reset()
	if d := b.Next(); d != 500*time.Millisecond {
		t.Fatalf("after Reset the first delay is half of Initial with r=0.5, got %v", d)
	}
}
