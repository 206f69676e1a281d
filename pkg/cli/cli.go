// Package cli holds what ferry's binaries share on the command line:
// parsing and validating options, and the logger flags.
package cli

import (
	"errors"
	"flag"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// Options are a binary's command-line options.
type Options interface {
	// AddFlags registers the options on fs.
	AddFlags(fs *pflag.FlagSet)
	// Validate reports every problem at once.
	Validate() error
}

// Parse registers o's flags, parses args and validates. help is true when
// the user asked for --help (usage was printed; the caller exits 0).
func Parse(name string, args []string, o Options) (help bool, err error) {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return true, nil
		}
		return false, err
	}
	return false, o.Validate()
}

// AddLogFlags registers the logger flags (--zap-log-level, --zap-devel, ...).
func AddLogFlags(fs *pflag.FlagSet, o *zap.Options) {
	gfs := flag.NewFlagSet("zap", flag.ContinueOnError)
	o.BindFlags(gfs)
	fs.AddGoFlagSet(gfs)
}

// NewLogger builds the structured logger from the flags and makes it
// controller-runtime's logger too.
func NewLogger(name string, o *zap.Options) logr.Logger {
	log := zap.New(zap.UseFlagOptions(o)).WithName(name)
	ctrl.SetLogger(log)
	return log
}
