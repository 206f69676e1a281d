package kcp

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
	apisv1alpha2 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha2"
	kcpcorev1alpha1 "github.com/kcp-dev/kcp/sdk/apis/core/v1alpha1"
	kcpclient "github.com/kcp-dev/kcp/sdk/client/clientset/versioned"
	kcpclientset "github.com/kcp-dev/kcp/sdk/client/clientset/versioned/cluster"
	apisv1alpha1client "github.com/kcp-dev/kcp/sdk/client/clientset/versioned/typed/apis/v1alpha1"
	apisv1alpha2client "github.com/kcp-dev/kcp/sdk/client/clientset/versioned/typed/apis/v1alpha2"
	corev1alpha1client "github.com/kcp-dev/kcp/sdk/client/clientset/versioned/typed/core/v1alpha1"
	"github.com/kcp-dev/logicalcluster/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/ferry-dev/ferry/broker/config"
)

// fakeKCP answers the resolver's reads from maps (workspace path → logical
// cluster, "path/name" → APIExport); every other kcp call panics (the
// embedded interfaces are nil). It counts the reads of LogicalClusters and
// holds each until its gate (if any) opens.
type fakeKCP struct {
	kcpclientset.ClusterInterface
	clusters map[string]string
	exports  map[string]bool
	// slices by "path/name" (nil: none).
	slices map[string]*apisv1alpha1.APIExportEndpointSlice
	reads  atomic.Int32
	// exportReads counts the reads of APIExports.
	exportReads atomic.Int32
	// gate returns the channel the n-th LogicalCluster read (from 1) waits
	// on; nil: none.
	gate func(n int32) <-chan struct{}
}

func (f *fakeKCP) Cluster(path logicalcluster.Path) kcpclient.Interface {
	return fakeWorkspace{f: f, path: path.String()}
}

type fakeWorkspace struct {
	kcpclient.Interface
	f    *fakeKCP
	path string
}

func (w fakeWorkspace) CoreV1alpha1() corev1alpha1client.CoreV1alpha1Interface { return fakeCore{w: w} }
func (w fakeWorkspace) ApisV1alpha2() apisv1alpha2client.ApisV1alpha2Interface {
	return fakeApis2{w: w}
}
func (w fakeWorkspace) ApisV1alpha1() apisv1alpha1client.ApisV1alpha1Interface {
	return fakeApis1{w: w}
}

type fakeCore struct {
	corev1alpha1client.CoreV1alpha1Interface
	w fakeWorkspace
}

func (c fakeCore) LogicalClusters() corev1alpha1client.LogicalClusterInterface {
	return fakeLogicalClusters{w: c.w}
}

type fakeLogicalClusters struct {
	corev1alpha1client.LogicalClusterInterface
	w fakeWorkspace
}

func (l fakeLogicalClusters) Get(ctx context.Context, name string, _ metav1.GetOptions) (*kcpcorev1alpha1.LogicalCluster, error) {
	f := l.w.f
	n := f.reads.Add(1)
	if f.gate != nil {
		if gate := f.gate(n); gate != nil {
			select {
			case <-gate:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	cluster, ok := f.clusters[l.w.path]
	if !ok || name != "cluster" {
		return nil, apierrors.NewNotFound(kcpcorev1alpha1.Resource("logicalclusters"), name)
	}
	return &kcpcorev1alpha1.LogicalCluster{ObjectMeta: metav1.ObjectMeta{
		Name: name, Annotations: map[string]string{logicalcluster.AnnotationKey: cluster},
	}}, nil
}

type fakeApis2 struct {
	apisv1alpha2client.ApisV1alpha2Interface
	w fakeWorkspace
}

func (a fakeApis2) APIExports() apisv1alpha2client.APIExportInterface { return fakeExports{w: a.w} }

type fakeExports struct {
	apisv1alpha2client.APIExportInterface
	w fakeWorkspace
}

func (e fakeExports) Get(_ context.Context, name string, _ metav1.GetOptions) (*apisv1alpha2.APIExport, error) {
	e.w.f.exportReads.Add(1)
	if !e.w.f.exports[e.w.path+"/"+name] {
		return nil, apierrors.NewNotFound(apisv1alpha2.Resource("apiexports"), name)
	}
	return &apisv1alpha2.APIExport{ObjectMeta: metav1.ObjectMeta{Name: name}}, nil
}

type fakeApis1 struct {
	apisv1alpha1client.ApisV1alpha1Interface
	w fakeWorkspace
}

func (a fakeApis1) APIExportEndpointSlices() apisv1alpha1client.APIExportEndpointSliceInterface {
	return fakeSlices{w: a.w}
}

// fakeSlices holds the fake's slices of one workspace.
type fakeSlices struct {
	apisv1alpha1client.APIExportEndpointSliceInterface
	w fakeWorkspace
}

// List lists the workspace's slices (the workspace's watch).
func (f fakeSlices) List(context.Context, metav1.ListOptions) (*apisv1alpha1.APIExportEndpointSliceList, error) {
	list := &apisv1alpha1.APIExportEndpointSliceList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}
	for key, s := range f.w.f.slices {
		if strings.HasPrefix(key, f.w.path+"/") {
			list.Items = append(list.Items, *s.DeepCopy())
		}
	}
	return list, nil
}

// Watch reports no change.
func (f fakeSlices) Watch(context.Context, metav1.ListOptions) (watch.Interface, error) {
	return watch.NewFake(), nil
}

func (f fakeSlices) Get(_ context.Context, name string, _ metav1.GetOptions) (*apisv1alpha1.APIExportEndpointSlice, error) {
	if s, ok := f.w.f.slices[f.w.path+"/"+name]; ok {
		return s.DeepCopy(), nil
	}
	return nil, apierrors.NewNotFound(apisv1alpha1.Resource("apiexportendpointslices"), name)
}

const (
	testWorkspace = "root:providers"
	testCluster   = "2x7kq0c1"
)

// workspaceWithExports is a fake kcp holding one workspace with n
// APIExports export-0 … export-(n-1).
func workspaceWithExports(n int) *fakeKCP {
	f := &fakeKCP{clusters: map[string]string{testWorkspace: testCluster}, exports: map[string]bool{}}
	for i := range n {
		f.exports[fmt.Sprintf("%s/export-%d", testWorkspace, i)] = true
	}
	return f
}

// A storm of handshakes for the exports of one workspace reads its
// LogicalCluster once: the calls that arrive while the first read is in
// flight share it.
func TestResolveSharesWorkspaceRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 20
		release := make(chan struct{})
		client := workspaceWithExports(n)
		client.slices = map[string]*apisv1alpha1.APIExportEndpointSlice{}
		for i := range n {
			name := fmt.Sprintf("export-%d", i)
			client.slices[testWorkspace+"/"+name] = endpointSlice(name)
		}
		client.gate = func(read int32) <-chan struct{} {
			if read == 1 {
				return release
			}
			return nil
		}
		r := NewResolver(client, EndpointRewrite{})
		r.slices.linger = 0 // each handshake's watch stops with it: nothing is kept
		r.slices.linger = 0 // nothing outlives the test's bubble
		states := make([]ExportState, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				states[i], errs[i] = r.Resolve(t.Context(), config.APIExportRef{Workspace: testWorkspace, Name: fmt.Sprintf("export-%d", i)})
			})
		}
		// The handshakes first wait for the workspace's slices to be
		// listed (fake time passes only while the test sleeps), then for
		// the first read, which the gate holds.
		for client.reads.Load() == 0 {
			time.Sleep(10 * time.Millisecond)
		}
		synctest.Wait() // every call is waiting for the first read
		close(release)
		wg.Wait()
		for i := range n {
			if errs[i] != nil || states[i].LogicalCluster != testCluster {
				t.Errorf("export-%d: %+v, %v; want logical cluster %s", i, states[i], errs[i], testCluster)
			}
		}
		if got := client.reads.Load(); got != 1 {
			t.Errorf("%d LogicalCluster reads for %d concurrent handshakes in one workspace, want 1", got, n)
		}
	})
}

// A handshake that arrives after a read finished reads again: nothing is
// kept between reads.
func TestResolveReadsAgainAfterARead(t *testing.T) {
	client := workspaceWithExports(1)
	r := NewResolver(client, EndpointRewrite{})
	r.slices.linger = 0 // each handshake's watch stops with it: nothing is kept
	ref := config.APIExportRef{Workspace: testWorkspace, Name: "export-0"}
	for range 3 {
		if _, err := r.Resolve(t.Context(), ref); err != nil {
			t.Fatal(err)
		}
	}
	if got := client.reads.Load(); got != 3 {
		t.Errorf("%d LogicalCluster reads for 3 handshakes one after another, want 3", got)
	}
}

// A handshake that joined the read of one that was then cancelled does not
// fail with the other's cancellation: it reads again under its own context.
func TestResolveJoinerOutlivesCancelledStarter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		client := workspaceWithExports(2)
		client.gate = func(read int32) <-chan struct{} {
			if read == 1 {
				return release // never opened: the starter's context ends first
			}
			return nil
		}
		r := NewResolver(client, EndpointRewrite{})
		r.slices.linger = 0 // each handshake's watch stops with it: nothing is kept
		r.slices.linger = 0 // nothing outlives the test's bubble
		starterCtx, cancelStarter := context.WithCancel(t.Context())
		var starterErr, joinerErr error
		var joined ExportState
		var wg sync.WaitGroup
		wg.Go(func() {
			_, starterErr = r.Resolve(starterCtx, config.APIExportRef{Workspace: testWorkspace, Name: "export-0"})
		})
		synctest.Wait() // the starter's read is in flight
		wg.Go(func() {
			joined, joinerErr = r.Resolve(t.Context(), config.APIExportRef{Workspace: testWorkspace, Name: "export-1"})
		})
		synctest.Wait() // the joiner waits for the starter's read
		cancelStarter()
		wg.Wait()
		if !errors.Is(starterErr, context.Canceled) {
			t.Errorf("starter: %v, want its cancellation", starterErr)
		}
		if joinerErr != nil || joined.LogicalCluster != testCluster {
			t.Errorf("joiner: %+v, %v; want logical cluster %s", joined, joinerErr, testCluster)
		}
		if got := client.reads.Load(); got != 2 {
			t.Errorf("%d LogicalCluster reads, want 2 (the cancelled one and the joiner's own)", got)
		}
	})
}

// Workspaces are read apart: a read of one never answers another.
func TestResolveDoesNotShareAcrossWorkspaces(t *testing.T) {
	client := workspaceWithExports(1)
	client.clusters["root:other"] = "9other"
	client.exports["root:other/export-0"] = true
	r := NewResolver(client, EndpointRewrite{})
	r.slices.linger = 0 // each handshake's watch stops with it: nothing is kept
	for ws, want := range map[string]string{testWorkspace: testCluster, "root:other": "9other"} {
		got, err := r.Resolve(t.Context(), config.APIExportRef{Workspace: ws, Name: "export-0"})
		if err != nil || got.LogicalCluster != want {
			t.Errorf("%s: %+v, %v; want %s", ws, got, err, want)
		}
	}
}

// A cold handshake of an export whose slice kcp made reads the slice and
// not the export (the slice says it exists); without a slice the export
// is read, and a missing export is reported as such.
func TestResolveReadsTheExportOnlyWithoutItsSlice(t *testing.T) {
	client := workspaceWithExports(2)
	client.slices = map[string]*apisv1alpha1.APIExportEndpointSlice{
		testWorkspace + "/export-0": endpointSlice("export-0", "https://shard/services/apiexport/x/export-0"),
	}
	r := NewResolver(client, EndpointRewrite{})
	r.slices.linger = 0 // each handshake's watch stops with it: nothing is kept
	got, err := r.Resolve(t.Context(), config.APIExportRef{Workspace: testWorkspace, Name: "export-0"})
	if err != nil || len(got.VirtualWorkspaceURLs) != 1 {
		t.Fatalf("export-0: %+v, %v", got, err)
	}
	if n := client.exportReads.Load(); n != 0 {
		t.Errorf("%d APIExport reads for an export whose slice exists, want none", n)
	}
	if _, err := r.Resolve(t.Context(), config.APIExportRef{Workspace: testWorkspace, Name: "export-1"}); err != nil {
		t.Fatalf("export-1 (no slice yet): %v", err)
	}
	_, err = r.Resolve(t.Context(), config.APIExportRef{Workspace: testWorkspace, Name: "gone"})
	var nf *NotFoundError
	if !errors.As(err, &nf) {
		t.Errorf("a missing export: %v, want NotFoundError", err)
	}
	if n := client.exportReads.Load(); n != 2 {
		t.Errorf("%d APIExport reads, want 2 (the two without a slice)", n)
	}
}
