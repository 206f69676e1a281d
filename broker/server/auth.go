package server

import (
	"context"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// enrolmentPrefix is the method prefix of the only calls served to a
// connection without a client certificate.
var enrolmentPrefix = "/" + ferryv1.EnrolmentService_ServiceDesc.ServiceName + "/"

// The TLS server verifies a client certificate when one is given, but lets
// connections without one through so that an edge holding only a token can
// enrol. These interceptors restore "a verified client certificate or
// nothing" for every other method, before any handler runs.
func requireClientCertUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if err := requireClientCert(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return handler(ctx, req)
}

func requireClientCertStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := requireClientCert(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}

func requireClientCert(ctx context.Context, method string) error {
	if strings.HasPrefix(method, enrolmentPrefix) {
		return nil
	}
	if _, _, err := identityFrom(ctx); err != nil {
		return status.Errorf(codes.Unauthenticated, "%s needs a client certificate signed by the broker's client CA: %v", method, err)
	}
	return nil
}
