package logging

import (
	"context"
	"fmt"

	"github.com/go-logr/logr"
	grpclogging "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
)

// GRPCLogger adapts a logr.Logger to go-grpc-middleware's logging
// interceptors. Debug messages go to V(1).
func GRPCLogger(l logr.Logger) grpclogging.Logger {
	return grpclogging.LoggerFunc(func(_ context.Context, lvl grpclogging.Level, msg string, fields ...any) {
		switch lvl {
		case grpclogging.LevelDebug:
			l.V(1).Info(msg, fields...)
		case grpclogging.LevelInfo:
			l.Info(msg, fields...)
		case grpclogging.LevelWarn:
			l.Info(msg, append(fields, "level", "warn")...)
		case grpclogging.LevelError:
			l.Error(nil, msg, fields...)
		default:
			l.Info(msg, append(fields, "level", fmt.Sprint(lvl))...)
		}
	})
}
