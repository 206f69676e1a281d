package main

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ferry-dev/ferry/pkg/cli"
)

func TestStreamDownNamesTheBrokersRefusal(t *testing.T) {
	tests := []struct {
		name    string
		refusal error
		want    string
	}{
		{name: "revoked certificate", refusal: status.Error(codes.Unauthenticated, `client certificate sha256:ab of identity "spiffe://x/edge" is revoked: leaked`),
			want: `[-]broker failed: the broker at broker:9443 refused this edge (Unauthenticated): client certificate sha256:ab of identity "spiffe://x/edge" is revoked: leaked`},
		{name: "unknown identity", refusal: status.Error(codes.PermissionDenied, `identity "spiffe://x/edge" is not configured at this broker`),
			want: `[-]broker failed: the broker at broker:9443 refused this edge (PermissionDenied): identity "spiffe://x/edge" is not configured at this broker`},
		{name: "no refusal", want: "[-]broker failed: no established stream to the broker at broker:9443"},
		{name: "not a status", refusal: errors.New("odd"), want: "refused this edge (Unknown): odd"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checks := cli.Checks{"broker": func(*http.Request) error { return streamDown("broker:9443", tc.refusal) }}
			rec := httptest.NewRecorder()
			checks.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), tc.want) {
				t.Errorf("/readyz = %d %q; want 500 containing %q", rec.Code, rec.Body.String(), tc.want)
			}
		})
	}
}
