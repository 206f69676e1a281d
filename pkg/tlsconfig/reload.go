package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"sync"
	"time"
)

// fileStamp identifies one version of a file on disk.
type fileStamp struct {
	modTime time.Time
	size    int64
}

func stamp(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{modTime: fi.ModTime(), size: fi.Size()}, nil
}

// reloading caches a value parsed from files and parses it again when any of
// the files changes. A failed reload keeps serving the last good value, so a
// half-written rotation never takes the connection down; the error is
// returned only while no good value exists. Safe for concurrent use.
type reloading[T any] struct {
	paths []string
	parse func(paths []string) (T, error)

	mu     sync.Mutex
	stamps []fileStamp
	value  T
	loaded bool
}

func newReloading[T any](parse func([]string) (T, error), paths ...string) (*reloading[T], error) {
	r := &reloading[T]{paths: paths, parse: parse}
	if _, err := r.get(); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *reloading[T]) get() (T, error) {
	r.mu.Lock()
	defer r.mu.Unlock()

	stamps := make([]fileStamp, len(r.paths))
	changed := !r.loaded
	for i, p := range r.paths {
		s, err := stamp(p)
		if err != nil {
			if r.loaded {
				return r.value, nil
			}
			var zero T
			return zero, fmt.Errorf("cannot read %s: %w", p, err)
		}
		stamps[i] = s
		if r.loaded && s != r.stamps[i] {
			changed = true
		}
	}
	if !changed {
		return r.value, nil
	}
	v, err := r.parse(r.paths)
	if err != nil {
		if r.loaded {
			return r.value, nil
		}
		var zero T
		return zero, err
	}
	r.value, r.stamps, r.loaded = v, stamps, true
	return v, nil
}

func parseKeyPair(paths []string) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(paths[0], paths[1])
	if err != nil {
		return nil, fmt.Errorf("invalid certificate %s or key %s: %w", paths[0], paths[1], err)
	}
	if len(cert.Certificate) == 0 {
		return nil, fmt.Errorf("certificate file %s holds no certificate", paths[0])
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("invalid certificate %s: %w", paths[0], err)
	}
	if time.Now().After(leaf.NotAfter) {
		return nil, fmt.Errorf("certificate %s expired at %s", paths[0], leaf.NotAfter.Format(time.RFC3339))
	}
	cert.Leaf = leaf
	return &cert, nil
}

func parseCAPool(paths []string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(paths[0])
	if err != nil {
		return nil, fmt.Errorf("cannot read CA bundle: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA bundle %s holds no PEM certificate", paths[0])
	}
	return pool, nil
}
