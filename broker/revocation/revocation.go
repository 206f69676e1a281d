// Package revocation holds the broker's blocked certificates and identities:
// the revoked[] entries of the broker configuration plus the blocks made
// through AdminService.Revoke, which are kept as Secrets (type
// ferry.dev/revocation) in the workspace of the APIExport the identity
// serves, so they survive restarts.
//
// Only one broker process serves a set of APIExports (the one-edge-per-export
// invariant lives in its memory), and every block it persists it also adds
// to its own set, so the Secrets are read once per workspace at start and
// never watched. A Secret written by hand takes effect at the next start.
package revocation

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// Secret layout of a block made through the admin API.
const (
	// SecretType is the type of every revocation Secret.
	SecretType corev1.SecretType = "ferry.dev/revocation"
	// LabelRevocation marks revocation Secrets (List selects on it).
	LabelRevocation = "ferry.dev/revocation"
	// LabelManagedBy and ManagedBy mark the broker's objects.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "ferry-broker"
	// Data keys.
	KeyIdentity          = "identity"
	KeyCertificateSHA256 = "certificateSHA256"
	KeyReason            = "reason"
)

// Sources of a block.
const (
	SourceConfiguration = "configuration"
	SourceAdmin         = "admin"
)

// Block is one blocked certificate, or a blocked identity.
type Block struct {
	// Identity is the blocked edge identity.
	Identity string
	// CertificateSHA256 is the blocked certificate (tlsconfig.Fingerprint
	// form); empty blocks every certificate of the identity.
	CertificateSHA256 string
	// Reason is shown to the refused edge.
	Reason string
	// Source is SourceConfiguration or SourceAdmin.
	Source string
}

// Message is what the refused edge is told: what is blocked and why.
func (b Block) Message() string {
	if b.CertificateSHA256 != "" {
		return fmt.Sprintf("client certificate %s of identity %q is revoked: %s", b.CertificateSHA256, b.Identity, b.Reason)
	}
	return fmt.Sprintf("identity %q is blocked: %s", b.Identity, b.Reason)
}

// Matches tells whether the block applies to a stream of identity
// authenticated with the certificate of fingerprint.
func (b Block) Matches(identity, fingerprint string) bool {
	return b.Identity == identity && (b.CertificateSHA256 == "" || b.CertificateSHA256 == fingerprint)
}

type key struct{ identity, fingerprint string }

// InvalidError is a Revoke request that names no valid block.
type InvalidError struct{ msg string }

func (e *InvalidError) Error() string { return e.msg }

// Options configure a Set.
type Options struct {
	// Config is the broker configuration: its revoked[] entries, and the
	// export workspace of each identity.
	Config *config.Config
	// Clients reach the export workspaces with the broker's kcp
	// credentials. Optional: nil keeps no admin blocks (only the
	// configuration's apply, and Revoke fails).
	Clients Clients
	// Namespace holds the revocation Secrets in each export workspace.
	Namespace string
	// Log receives the set's logs.
	Log logr.Logger
}

// Set is the broker's blocks. Safe for concurrent use.
type Set struct {
	opts Options

	mu     sync.RWMutex
	blocks map[key]Block
	// loaded holds the workspaces whose Secrets have been listed.
	loaded map[string]bool
}

// New returns the set holding the configuration's blocks; Load adds the
// admin blocks kept in kcp. Config.Validate refuses an unparsable
// fingerprint; should an unvalidated one get here, it blocks the whole
// identity rather than nothing.
func New(o Options) *Set {
	if o.Config == nil {
		o.Config = &config.Config{}
	}
	s := &Set{opts: o, blocks: map[key]Block{}, loaded: map[string]bool{}}
	for i, r := range o.Config.Revoked {
		fp := ""
		if r.CertificateSHA256 != "" {
			var err error
			if fp, err = tlsconfig.ParseFingerprint(r.CertificateSHA256); err != nil {
				o.Log.Error(err, "blocking the whole identity of a revoked[] entry with an unparsable fingerprint", "entry", i, "identity", r.Identity)
			}
		}
		s.blocks[key{r.Identity, fp}] = Block{Identity: r.Identity, CertificateSHA256: fp, Reason: r.Reason, Source: SourceConfiguration}
	}
	return s
}

// Blocked tells whether a stream of identity authenticated with the
// certificate of fingerprint (tlsconfig.Fingerprint form) is blocked, and
// why. It answers from memory: call EnsureLoaded first.
func (s *Set) Blocked(identity, fingerprint string) (reason string, blocked bool) {
	b, ok := s.Match(identity, fingerprint)
	return b.Reason, ok
}

// Match returns the block that applies to identity and fingerprint: the
// certificate's own block before the identity's.
func (s *Set) Match(identity, fingerprint string) (Block, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if fingerprint != "" {
		if b, ok := s.blocks[key{identity, fingerprint}]; ok {
			return b, true
		}
	}
	b, ok := s.blocks[key{identity, ""}]
	return b, ok
}

// Blocks lists every block, ordered by identity and fingerprint.
func (s *Set) Blocks() []Block {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]Block, 0, len(s.blocks))
	for _, b := range s.blocks {
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b Block) int {
		return strings.Compare(a.Identity+"\x00"+a.CertificateSHA256, b.Identity+"\x00"+b.CertificateSHA256)
	})
	return out
}

// Load lists the revocation Secrets of every configured export workspace
// not listed yet: one List per workspace. It returns every failure; the
// workspaces that failed are listed again by the next Load or
// EnsureLoaded.
func (s *Set) Load(ctx context.Context) error {
	// In parallel, bounded: the broker serves only once they are read,
	// and a hundred workspaces listed one after another delayed a
	// restarted broker's first handshake by more than a second.
	workspaces := s.workspaces()
	errs := make([]error, len(workspaces))
	sem := make(chan struct{}, loadParallel)
	var wg sync.WaitGroup
	for i, ws := range workspaces {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = s.loadWorkspace(ctx, ws)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// loadParallel bounds the workspaces Load lists at once.
const loadParallel = 16

// EnsureLoaded lists the revocation Secrets of identity's export workspace
// unless that was done: a stream must not be accepted on blocks that were
// never read (kcp unreachable at start).
func (s *Set) EnsureLoaded(ctx context.Context, identity string) error {
	e, ok := s.opts.Config.EdgeFor(identity)
	if !ok {
		return nil // not an edge: nothing of it is kept
	}
	return s.loadWorkspace(ctx, e.APIExport.Workspace)
}

// workspaces are the export workspaces of the configured edges, each once.
func (s *Set) workspaces() []string {
	var out []string
	for _, e := range s.opts.Config.Edges {
		if !slices.Contains(out, e.APIExport.Workspace) {
			out = append(out, e.APIExport.Workspace)
		}
	}
	return out
}

func (s *Set) loadWorkspace(ctx context.Context, workspace string) error {
	s.mu.RLock()
	done := s.loaded[workspace]
	s.mu.RUnlock()
	if done || s.opts.Clients == nil {
		return nil
	}
	client, err := s.opts.Clients.Secrets(workspace)
	if err != nil {
		return err
	}
	list, err := client.Secrets(s.opts.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.Set{LabelRevocation: "true"}.String(),
	})
	if err != nil {
		return fmt.Errorf("cannot list the revocations (Secrets %s=true) in namespace %s of workspace %s: %w",
			LabelRevocation, s.opts.Namespace, workspace, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.loaded[workspace] {
		return nil // a concurrent load won
	}
	n := 0
	for i := range list.Items {
		sec := &list.Items[i]
		b, err := s.fromSecret(sec, workspace)
		if err != nil {
			// A broken Secret blocks nothing; it is not ours to delete.
			s.opts.Log.Error(err, "ignoring a revocation Secret", "workspace", workspace, "namespace", sec.Namespace, "name", sec.Name)
			continue
		}
		k := key{b.Identity, b.CertificateSHA256}
		if _, ok := s.blocks[k]; !ok {
			s.blocks[k] = b
		}
		n++
	}
	s.loaded[workspace] = true
	s.opts.Log.Info("revocations loaded", "workspace", workspace, "namespace", s.opts.Namespace, "count", n)
	return nil
}

// fromSecret reads a revocation Secret of workspace: it only counts for an
// identity whose export lives there, so a Secret in one workspace cannot
// block another workspace's edge.
func (s *Set) fromSecret(sec *corev1.Secret, workspace string) (Block, error) {
	if sec.Type != SecretType {
		return Block{}, fmt.Errorf("type is %q, not %q", sec.Type, SecretType)
	}
	id := string(sec.Data[KeyIdentity])
	e, ok := s.opts.Config.EdgeFor(id)
	switch {
	case !ok:
		return Block{}, fmt.Errorf("identity %q is not configured", id)
	case e.APIExport.Workspace != workspace:
		return Block{}, fmt.Errorf("identity %q serves an APIExport of workspace %s, not this one", id, e.APIExport.Workspace)
	}
	fp := ""
	if raw := string(sec.Data[KeyCertificateSHA256]); raw != "" {
		var err error
		if fp, err = tlsconfig.ParseFingerprint(raw); err != nil {
			return Block{}, err
		}
	}
	reason := string(sec.Data[KeyReason])
	if strings.TrimSpace(reason) == "" {
		return Block{}, errors.New("no reason")
	}
	return Block{Identity: id, CertificateSHA256: fp, Reason: reason, Source: SourceAdmin}, nil
}

// Revoke validates a block, keeps it in kcp and adds it to the set. A
// request naming no valid block fails with *InvalidError. Revoking what is
// already revoked replaces the reason.
func (s *Set) Revoke(ctx context.Context, identity, fingerprint, reason string) (Block, error) {
	b, edge, err := s.validate(identity, fingerprint, reason)
	if err != nil {
		return Block{}, err
	}
	if err := s.persist(ctx, b, edge.APIExport.Workspace); err != nil {
		return Block{}, err
	}
	s.mu.Lock()
	s.blocks[key{b.Identity, b.CertificateSHA256}] = b
	s.mu.Unlock()
	s.opts.Log.Info("revoked", "identity", b.Identity, "certificateSHA256", b.CertificateSHA256, "reason", b.Reason)
	return b, nil
}

func (s *Set) validate(identity, fingerprint, reason string) (Block, config.Edge, error) {
	edge, ok := s.opts.Config.EdgeFor(identity)
	switch {
	case identity == "":
		return Block{}, edge, &InvalidError{"identity is required: the edge identity to block (a certificate's URI SAN or CN)"}
	case !ok:
		return Block{}, edge, &InvalidError{fmt.Sprintf("identity %q is not configured at this broker (edges[] in the broker configuration)", identity)}
	case strings.TrimSpace(reason) == "":
		return Block{}, edge, &InvalidError{"reason is required: it is shown to the refused edge"}
	}
	fp := ""
	if fingerprint != "" {
		var err error
		if fp, err = tlsconfig.ParseFingerprint(fingerprint); err != nil {
			return Block{}, edge, &InvalidError{"certificate_sha256: " + err.Error()}
		}
	}
	return Block{Identity: identity, CertificateSHA256: fp, Reason: reason, Source: SourceAdmin}, edge, nil
}

// SecretName is the name of the Secret keeping a block: derived from what it
// blocks, so revoking twice updates one Secret.
func SecretName(identity, fingerprint string) string {
	sum := sha256.Sum256([]byte(identity + "\n" + fingerprint))
	return "ferry-revocation-" + hex.EncodeToString(sum[:10])
}

func (s *Set) persist(ctx context.Context, b Block, workspace string) error {
	if s.opts.Clients == nil {
		return errors.New("this broker keeps no revocations in kcp (no kcp clients); block it in revoked[] of the broker configuration")
	}
	client, err := s.opts.Clients.Secrets(workspace)
	if err != nil {
		return err
	}
	secrets := client.Secrets(s.opts.Namespace)
	want := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      SecretName(b.Identity, b.CertificateSHA256),
			Namespace: s.opts.Namespace,
			Labels:    map[string]string{LabelRevocation: "true", LabelManagedBy: ManagedBy},
		},
		Type: SecretType,
		Data: map[string][]byte{KeyIdentity: []byte(b.Identity), KeyCertificateSHA256: []byte(b.CertificateSHA256), KeyReason: []byte(b.Reason)},
	}
	where := fmt.Sprintf("Secret %s/%s in workspace %s", s.opts.Namespace, want.Name, workspace)
	_, err = secrets.Create(ctx, want, metav1.CreateOptions{})
	if !apierrors.IsAlreadyExists(err) {
		if err != nil {
			return fmt.Errorf("cannot keep the revocation as %s: %w", where, err)
		}
		return nil
	}
	cur, err := secrets.Get(ctx, want.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("cannot read the existing revocation %s: %w", where, err)
	}
	if cur.Type != SecretType {
		return fmt.Errorf("%s exists but is not a revocation (type %q)", where, cur.Type)
	}
	cur.Data, cur.Labels = want.Data, want.Labels
	if _, err := secrets.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("cannot update the revocation %s: %w", where, err)
	}
	return nil
}
