package logging

import (
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	grpclogging "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
)

func TestGRPCLoggerMapsLevels(t *testing.T) {
	for _, tc := range []struct {
		level grpclogging.Level
		// verbosity the logger needs to print it; want is in its line.
		verbosity int
		want      string
	}{
		{grpclogging.LevelDebug, 1, `"level"=1 "msg"="finished call" "grpc.code"="OK"`},
		{grpclogging.LevelInfo, 0, `"level"=0 "msg"="finished call" "grpc.code"="OK"`},
		{grpclogging.LevelWarn, 0, `"grpc.code"="OK" "level"="warn"`},
		{grpclogging.LevelError, 0, `"msg"="finished call" "error"=null "grpc.code"="OK"`},
		{grpclogging.Level(12), 0, `"level"="12"`},
	} {
		for v := 0; v <= 1; v++ {
			var lines []string
			l := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{Verbosity: v})
			GRPCLogger(l).Log(context.Background(), tc.level, "finished call", "grpc.code", "OK")
			out := strings.Join(lines, "\n")
			shown := v >= tc.verbosity
			if shown != (len(lines) == 1) || (shown && !strings.Contains(out, tc.want)) {
				t.Errorf("level %v at verbosity %d logged %q; want shown=%v containing %q", tc.level, v, out, shown, tc.want)
			}
		}
	}
}
