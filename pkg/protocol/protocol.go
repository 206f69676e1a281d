// Package protocol holds the rules of the edge ↔ broker handshake that both
// sides apply: version negotiation, capabilities, limits and liveness.
package protocol

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// Version is the protocol version this build speaks. A peer one version
// older or newer is accepted; both then use the lower one.
const Version uint32 = 1

// Limits and defaults shared by both sides.
const (
	// DefaultHeartbeatInterval is used when no interval is configured.
	DefaultHeartbeatInterval = 10 * time.Second
	// MinHeartbeatInterval is the shortest interval either side accepts.
	MinHeartbeatInterval = time.Second
	// MissedHeartbeats is how many intervals of silence end a stream.
	MissedHeartbeats = 3
	// DefaultMaxMessageBytes is the default receive limit (gRPC's default).
	DefaultMaxMessageBytes = 4 << 20
	// MinMaxMessageBytes is the smallest receive limit either side accepts.
	MinMaxMessageBytes = 64 << 10
	// HandshakeTimeout bounds the wait for the peer's hello.
	HandshakeTimeout = 15 * time.Second
)

// Capabilities returns the capabilities this build supports.
func Capabilities() []ferryv1.Capability {
	return []ferryv1.Capability{
		ferryv1.Capability_CAPABILITY_STATUS,
		ferryv1.Capability_CAPABILITY_RELATED_OBJECTS,
		ferryv1.Capability_CAPABILITY_INVENTORY_RESYNC,
		ferryv1.Capability_CAPABILITY_INVENTORY_REQUEST,
		ferryv1.Capability_CAPABILITY_CERTIFICATE_RENEWAL,
	}
}

// ErrVersionSkew is returned when the peer's protocol version is too far from
// ours.
var ErrVersionSkew = errors.New("protocol version skew")

// NegotiateVersion returns the version both sides use, given the peer's
// highest version.
func NegotiateVersion(peer uint32) (uint32, error) {
	switch {
	case peer == 0:
		return 0, fmt.Errorf("%w: peer sent no protocol version", ErrVersionSkew)
	case peer+1 < Version:
		return 0, fmt.Errorf("%w: peer speaks version %d, this broker needs at least %d", ErrVersionSkew, peer, Version-1)
	case peer > Version+1:
		return 0, fmt.Errorf("%w: peer speaks version %d, this broker at most %d (one version of skew is tolerated)", ErrVersionSkew, peer, Version)
	}
	return min(peer, Version), nil
}

// IntersectCapabilities returns the capabilities both sides announced, in
// our order.
func IntersectCapabilities(peer []ferryv1.Capability) []ferryv1.Capability {
	var out []ferryv1.Capability
	for _, c := range Capabilities() {
		if slices.Contains(peer, c) {
			out = append(out, c)
		}
	}
	return out
}

// NegotiateHeartbeat returns the interval both sides use: the longer of the
// two proposals, so neither side is asked to be more chatty than it wants.
func NegotiateHeartbeat(ours, peer time.Duration) time.Duration {
	return max(ours, peer, MinHeartbeatInterval)
}

// ValidateEdgeHello reports every problem of an EdgeHello at once.
func ValidateEdgeHello(h *ferryv1.EdgeHello) error {
	if h == nil {
		return errors.New("the first message must be an EdgeHello")
	}
	var errs []error
	if h.GetProtocolVersion() == 0 {
		errs = append(errs, errors.New("protocol_version is required"))
	}
	if msgs := validation.IsDNS1123Label(h.GetAgentName()); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("agent_name %q is not a DNS label: %v", h.GetAgentName(), msgs))
	}
	if h.GetMaxReceiveMessageBytes() < MinMaxMessageBytes {
		errs = append(errs, fmt.Errorf("max_receive_message_bytes must be at least %d, got %d", MinMaxMessageBytes, h.GetMaxReceiveMessageBytes()))
	}
	if hb := h.GetHeartbeatInterval(); hb == nil || hb.AsDuration() < MinHeartbeatInterval {
		errs = append(errs, fmt.Errorf("heartbeat_interval must be at least %s", MinHeartbeatInterval))
	}
	return errors.Join(errs...)
}

// DeadAfter is how long a side waits without any message before it treats
// the stream as dead.
func DeadAfter(heartbeat time.Duration) time.Duration {
	return MissedHeartbeats * heartbeat
}
