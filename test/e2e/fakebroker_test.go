package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/projection"
	"github.com/ferry-dev/ferry/pkg/protocol"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// fakeHeartbeat is the heartbeat interval the fake broker negotiates; it
// sends its own heartbeats more often.
const fakeHeartbeat = 2 * time.Second

// fakeBroker is a broker that speaks the protocol but lies: it answers every
// Publish as published (with the projection the real broker would make) and
// sends whatever intents the test asks for. Its log is fake-broker.log in
// the test's directory.
type fakeBroker struct {
	ferryv1.UnimplementedSyncServiceServer

	export string
	epoch  uint64
	addr   string

	logMu sync.Mutex
	log   *os.File

	mu          sync.Mutex
	current     *fakeBrokerStream
	hellos      int
	published   map[string]*ferryv1.GroupVersionResource
	results     []*ferryv1.IntentResult
	seq         uint64
	connectedCh chan struct{}
}

type fakeBrokerStream struct {
	mu     sync.Mutex
	stream ferryv1.SyncService_ConnectServer
}

func (s *fakeBrokerStream) send(m *ferryv1.ConnectResponse) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stream.Send(m)
}

// startFakeBroker serves the fake broker with pki's broker certificate,
// requiring client certificates of pki's CA, as the real broker does.
func startFakeBroker(t testing.TB, pki, export string) *fakeBroker {
	t.Helper()
	tlsCfg, err := tlsconfig.Server(tlsconfig.Files{
		CertFile: devpki.CertFile(pki, "broker"), KeyFile: devpki.KeyFile(pki, "broker"), CAFile: filepath.Join(pki, devpki.CACertFile),
	}, tlsconfig.Profile{}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(testDir(t), "fake-broker.log"))
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeBroker{
		export: export, epoch: uint64(time.Now().UnixNano()), addr: lis.Addr().String(), log: logFile,
		published: map[string]*ferryv1.GroupVersionResource{}, connectedCh: make(chan struct{}),
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsCfg)))
	ferryv1.RegisterSyncServiceServer(srv, f)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Stop()
		f.logMu.Lock()
		defer f.logMu.Unlock()
		_ = f.log.Close()
	})
	return f
}

func (f *fakeBroker) logf(format string, args ...any) {
	f.logMu.Lock()
	defer f.logMu.Unlock()
	fmt.Fprintf(f.log, "%s "+format+"\n", append([]any{time.Now().Format(time.RFC3339Nano)}, args...)...)
}

// Connect implements SyncService: the handshake as broker/server/sync.go
// does it, then heartbeats, publish results and report answers.
func (f *fakeBroker) Connect(stream ferryv1.SyncService_ConnectServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "the first message must be an EdgeHello")
	}
	f.logf("edge hello: %v", hello)
	s := &fakeBrokerStream{stream: stream}
	f.mu.Lock()
	f.hellos++
	session := fmt.Sprintf("fake-%d", f.hellos)
	f.mu.Unlock()
	err = s.send(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Hello{Hello: &ferryv1.BrokerHello{
		ProtocolVersion:        protocol.Version,
		Capabilities:           protocol.IntersectCapabilities(hello.GetCapabilities()),
		Identity:               devpki.IdentityFor("edge"),
		MaxReceiveMessageBytes: protocol.DefaultMaxMessageBytes,
		HeartbeatInterval:      durationpb.New(fakeHeartbeat),
		BrokerVersion:          "malicious",
		BrokerEpoch:            f.epoch,
		SessionId:              session,
		Export: &ferryv1.ExportStatus{
			Export:         &ferryv1.APIExportReference{WorkspacePath: "root:malicious", Name: f.export},
			LogicalCluster: "malicious", VirtualWorkspaceReady: true,
		},
	}}})
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.current = s
	if f.hellos == 1 {
		close(f.connectedCh)
	}
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		if f.current == s {
			f.current = nil
		}
		f.mu.Unlock()
	}()

	ctx := stream.Context()
	go func() {
		tick := time.NewTicker(fakeHeartbeat / 4)
		defer tick.Stop()
		for seq := uint64(1); ; seq++ {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if s.send(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Heartbeat{Heartbeat: &ferryv1.Heartbeat{
				SentAt: timestamppb.Now(), Sequence: seq,
			}}}) != nil {
				return
			}
		}
	}()
	answer := func(id uint64) error {
		return s.send(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_ReportResult{ReportResult: &ferryv1.ReportResult{ReportId: id}}})
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			f.logf("stream %s ended: %v", session, err)
			return nil
		}
		if msg.GetHeartbeat() == nil {
			f.logf("edge → %T: %v", msg.GetMessage(), msg)
		}
		switch m := msg.GetMessage().(type) {
		case *ferryv1.ConnectRequest_Publish:
			err = s.send(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_PublishResult{PublishResult: f.publish(m.Publish)}})
		case *ferryv1.ConnectRequest_IntentResult:
			f.mu.Lock()
			f.results = append(f.results, m.IntentResult)
			f.mu.Unlock()
		case *ferryv1.ConnectRequest_StatusReport:
			err = answer(m.StatusReport.GetReportId())
		case *ferryv1.ConnectRequest_RelatedObjectReport:
			err = answer(m.RelatedObjectReport.GetReportId())
		case *ferryv1.ConnectRequest_DeletionConfirmation:
			err = answer(m.DeletionConfirmation.GetReportId())
		case *ferryv1.ConnectRequest_ResendRequest:
			err = answer(m.ResendRequest.GetReportId())
		}
		if err != nil {
			f.logf("cannot answer: %v", err)
			return err
		}
	}
}

// publish answers a Publish as the real broker does once kcp serves the
// schema (broker/publish/publisher.go), without going near kcp.
func (f *fakeBroker) publish(p *ferryv1.Publish) *ferryv1.PublishResult {
	res := &ferryv1.PublishResult{PublishedResource: p.GetPublishedResource(), Generation: p.GetGeneration(), Revision: p.GetRevision()}
	var spec ferryv1alpha1.PublishedResourceSpec
	var crd apiextensionsv1.CustomResourceDefinition
	var proj *projection.Result
	err := json.Unmarshal(p.GetSpec(), &spec)
	if err == nil {
		err = json.Unmarshal(p.GetCustomResourceDefinition(), &crd)
	}
	if err == nil {
		proj, err = projection.Project(&spec, &crd, f.export)
	}
	if err != nil {
		res.State, res.Reason, res.Message = ferryv1.PublishState_PUBLISH_STATE_FAILED, ferryv1alpha1.ReasonProjectionInvalid, err.Error()
		return res
	}
	gvr := &ferryv1.GroupVersionResource{Group: proj.Resource.Group, Version: proj.Resource.Version, Resource: proj.Resource.Resource}
	res.State, res.Reason = ferryv1.PublishState_PUBLISH_STATE_PUBLISHED, ferryv1alpha1.ReasonPublished
	res.Message = fmt.Sprintf("served as %s in APIExport %s", proj.Resource.GroupResource(), f.export)
	res.ResourceSchemaName, res.ProjectedKind, res.ServedResource = proj.Schema.Name, proj.Kind, gvr
	f.mu.Lock()
	f.published[p.GetPublishedResource()] = gvr
	f.mu.Unlock()
	return res
}

// waitConnected waits for the first handshake.
func (f *fakeBroker) waitConnected(t testing.TB, timeout time.Duration) {
	t.Helper()
	select {
	case <-f.connectedCh:
	case <-time.After(timeout):
		t.Fatalf("the edge did not connect to the fake broker within %s", timeout)
	}
}

func (f *fakeBroker) connections() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hellos
}

// served is the resource the fake broker told the edge it serves for a
// PublishedResource.
func (f *fakeBroker) served(t testing.TB, pr string) *ferryv1.GroupVersionResource {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	gvr, ok := f.published[pr]
	if !ok {
		t.Fatalf("the fake broker never published %s", pr)
	}
	return gvr
}

// upsertIntent is an upsert of obj under key for PublishedResource pr.
func upsertIntent(pr string, key *ferryv1.ObjectKey, obj map[string]any) *ferryv1.SyncIntent {
	data, err := json.Marshal(obj)
	if err != nil {
		panic(err)
	}
	sum := sha256.Sum256(data)
	return &ferryv1.SyncIntent{Key: key, PublishedResource: pr, Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{
		Object: data, ContentHash: hex.EncodeToString(sum[:])[:16],
	}}}
}

// exchange sends in until the edge gives an answer other than "not yet"
// (NOT_READY, or UNAVAILABLE, e.g. a related object's primary the edge's
// cache does not show yet) and returns it. Each attempt is a new version.
func (f *fakeBroker) exchange(t testing.TB, in *ferryv1.SyncIntent) *ferryv1.IntentResult {
	t.Helper()
	what := protocol.IntentKey(in.GetKey(), in.GetRelatedTo())
	deadline := time.Now().Add(90 * time.Second)
	var last *ferryv1.IntentResult
	for time.Now().Before(deadline) {
		f.mu.Lock()
		f.seq++
		seq, s := f.seq, f.current
		f.mu.Unlock()
		if s == nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		in.Version = &ferryv1.ObjectVersion{BrokerEpoch: f.epoch, Sequence: seq, ResourceVersion: fmt.Sprint(seq), Generation: 1}
		f.logf("broker → intent %s (sequence %d, related %v)", what, seq, in.GetRelatedTo() != nil)
		if err := s.send(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Intent{Intent: in}}); err != nil {
			time.Sleep(200 * time.Millisecond)
			continue
		}
		res := f.waitResult(what, seq, 15*time.Second)
		if res == nil {
			continue
		}
		last = res
		switch res.GetError().GetReason() {
		case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_READY, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_UNAVAILABLE:
			time.Sleep(300 * time.Millisecond)
			continue
		}
		return res
	}
	t.Fatalf("the edge gave no final answer to the intent for %s within 90s; last answer: %v", what, last)
	return nil
}

// waitResult waits for the edge's answer to the intent for key with
// sequence seq.
func (f *fakeBroker) waitResult(key string, seq uint64, timeout time.Duration) *ferryv1.IntentResult {
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		f.mu.Lock()
		for _, r := range f.results {
			if r.GetVersion().GetSequence() == seq && protocol.IntentKey(r.GetKey(), r.GetRelatedTo()) == key {
				f.mu.Unlock()
				return r
			}
		}
		f.mu.Unlock()
	}
	return nil
}
