package main

// An incarnation is everything the edge builds to lead: the controller
// manager, the sync engine, the publish store, the broker link. When the
// service cluster's API server goes away for longer than the renew deadline,
// the edge loses its Lease and controller-runtime stops the manager for good —
// a stopped manager cannot be started again. Exiting then (what the edge did
// before) turns every API server outage into a pod restart, and kubelet's
// CrashLoopBackOff can add minutes on top of the outage. Instead, run keeps
// the process and starts a fresh incarnation, which waits for the API server,
// wins the Lease back at once (same identity, see leaderIdentity) and resyncs
// with the broker. Nothing of a stopped incarnation is reused: a shut down
// workqueue or manager cannot be restarted, and fresh objects cannot carry
// half-stopped state into the next term.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	edgeadmin "github.com/ferry-dev/ferry/edge/admin"
	"github.com/ferry-dev/ferry/edge/enrol"
	"github.com/ferry-dev/ferry/edge/objectlog"
	"github.com/ferry-dev/ferry/edge/publish"
	"github.com/ferry-dev/ferry/edge/replication"
	"github.com/ferry-dev/ferry/edge/session"
	"github.com/ferry-dev/ferry/edge/stream"
	"github.com/ferry-dev/ferry/pkg/backoff"
	"github.com/ferry-dev/ferry/pkg/link"
	"github.com/ferry-dev/ferry/pkg/metrics"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

const (
	// incarnationStopTimeout bounds the wait for the broker link and the sync
	// engine of a stopped incarnation. A new incarnation must not run beside
	// them (two engines applying, two streams for one edge at the broker); if
	// they hang, exiting is the safe way out.
	incarnationStopTimeout = 30 * time.Second
	// apiServerPollInterval is how often a new incarnation probes the API
	// server while it is away. Jittered up to twice this: replicas that lost
	// their lease in the same outage do not probe in lockstep. Short, so the
	// edge resumes within about a second of the API server's return.
	apiServerPollInterval = 500 * time.Millisecond
	// apiServerProbeTimeout bounds one probe: an API server behind a
	// black-holed route would otherwise hold it for the TCP timeout.
	apiServerProbeTimeout = 2 * time.Second
)

// errLeadershipLost marks an incarnation that ended because it lost the
// Lease; run starts a new one instead of exiting.
var errLeadershipLost = errors.New("leadership lost")

// restartAfter decides what run does when an incarnation returned err: start
// a new incarnation only when the incarnation lost its leadership and the
// process is not stopping. Every other error ends the process as before: a
// broken configuration or a failing component does not get better by
// starting it again in a loop, and the pod's restart policy stays in charge
// of those.
func restartAfter(ctx context.Context, err error) bool {
	return ctx.Err() == nil && errors.Is(err, errLeadershipLost)
}

// edgeProcess is what all incarnations of the process share: options, the
// scheme, the logger, and the leader election identity and clients.
type edgeProcess struct {
	cfg    *Completed
	scheme *runtime.Scheme
	log    logr.Logger
	// identity is this process's leader election identity; empty without
	// --leader-elect.
	identity string
	// leaderClient talks to the service cluster for the Lease and the
	// readiness probe; nil without --leader-elect.
	leaderClient kubernetes.Interface
	// events records leader election Events on the Lease (the default lock
	// of controller-runtime did too); nil without --leader-elect.
	events resourcelock.EventRecorder
	// metrics are the process's metrics; each incarnation points the state
	// gauges at its engine.
	metrics *metrics.Edge
	// current is the running incarnation, for the readiness probe.
	current atomic.Pointer[incarnationState]
	// admin is the edge's local admin API; each incarnation points it at
	// its own state. nil when not served.
	admin *edgeadmin.Server
	// tls is the client TLS configuration once known (for metrics and
	// readiness, which run while the edge enrols).
	tls atomic.Pointer[tlsconfig.ClientConfig]
	// credentials and renewer are set for an enrolled edge (credentials
	// in a Secret, renewed over the stream); nil with certificate files.
	credentials *enrol.SecretStore
	renewer     *enrol.Renewer
}

// incarnationState is what the readiness probe reads of an incarnation.
type incarnationState struct {
	// leading is set once the incarnation won the Lease (at once without
	// leader election).
	leading atomic.Bool
	stream  *stream.Client
}

// leaderIdentity is the identity this process holds the Lease under, fixed
// for the life of the process. client-go's elector treats a Lease whose
// holder is its own identity as a renewal, even from a new elector: a new
// incarnation, or a new process of the same replica (a container restarted
// in its pod keeps the pod name), takes the Lease back at once instead of
// waiting out the lease duration its predecessor left behind.
// controller-runtime's default lock would draw a new random identity for
// every manager. Without a configured identity the host name gets a random
// suffix: two replicas with the same host name (host network, or two
// processes on one machine) must never share an identity, since both would
// lead.
func leaderIdentity(configured string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("cannot read the host name for the leader election identity: %w", err)
	}
	return host + "_" + string(uuid.NewUUID()), nil
}

// leaseName is the name of the leader election Lease of the edges called
// like this one.
func leaseName(o *Options) string { return "ferry-edge-" + o.AgentName }

// leaderConfig is the service cluster's config for leader election, with the
// user agent and request timeout controller-runtime's default lock uses: a
// single hung request must not use up the whole renew deadline.
func leaderConfig(svc *rest.Config, renewDeadline time.Duration) *rest.Config {
	cfg := rest.AddUserAgent(rest.CopyConfig(svc), "leader-election")
	cfg.Timeout = max(renewDeadline/2, time.Second)
	// A limiter of its own (same QPS and burst): a renewal must not wait
	// behind a burst of applies in the process's shared budget.
	cfg.RateLimiter = nil
	return cfg
}

// runIncarnation builds and runs everything leader-scoped until ctx ends or
// the incarnation stops; an incarnation that lost its leadership returns an
// error matching errLeadershipLost.
func (p *edgeProcess) runIncarnation(ctx context.Context, n int) error {
	opts := p.cfg.Options
	log := p.log.WithValues("incarnation", n)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	mgrOpts := ctrl.Options{
		Scheme:                 p.scheme,
		Logger:                 log,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&ferryv1alpha1.PublishedResource{}: {Label: p.cfg.Selector},
		}},
		// controller-runtime refuses a second controller of the same name in
		// one process; every incarnation registers "publish" again, and the
		// earlier one is stopped by then.
		Controller:                    config.Controller{SkipNameValidation: new(true)},
		LeaderElection:                opts.LeaderElect,
		LeaderElectionID:              leaseName(opts),
		LeaderElectionNamespace:       opts.LeaderNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &opts.LeaseDuration,
		RenewDeadline:                 &opts.RenewDeadline,
		RetryPeriod:                   &opts.RetryPeriod,
	}
	var lock *observedLock
	if opts.LeaderElect {
		// A fresh lock per incarnation (it caches the Lease it last read) with
		// the process's identity.
		rl, err := resourcelock.New(resourcelock.LeasesResourceLock, opts.LeaderNamespace, mgrOpts.LeaderElectionID,
			p.leaderClient.CoreV1(), p.leaderClient.CoordinationV1(),
			resourcelock.ResourceLockConfig{Identity: p.identity, EventRecorder: p.events})
		if err != nil {
			return fmt.Errorf("cannot set up the leader election lock: %w", err)
		}
		lock = &observedLock{Interface: rl}
		mgrOpts.LeaderElectionResourceLockInterface = lock
	}
	mgr, err := ctrl.NewManager(p.cfg.Service, mgrOpts)
	if err != nil {
		return fmt.Errorf("cannot set up the controller manager for the service cluster: %w", err)
	}
	dyn, err := dynamic.NewForConfig(p.cfg.Service)
	if err != nil {
		return fmt.Errorf("cannot create a dynamic client for the service cluster: %w", err)
	}
	kube, err := kubernetes.NewForConfig(p.cfg.Service)
	if err != nil {
		return fmt.Errorf("cannot create a client for the service cluster: %w", err)
	}
	wake, pending := link.NewWake()
	store := publish.NewStore(opts.BrokerAddress, wake)
	objects := objectlog.New(nil)
	engine := replication.NewEngine(replication.Options{Agent: opts.AgentName, Dynamic: dyn, Kube: kube, Wake: wake, Log: log.WithName("replica"),
		RelatedClusterWide: opts.RelatedCacheClusterWide, Observer: replication.Observers(p.metrics, objects)})
	builtins := &publish.Builtins{Mapper: mgr.GetRESTMapper(), Reader: mgr.GetAPIReader(), OpenAPI: kube.Discovery().OpenAPIV3WithContext(ctx)}
	if err := (&publish.Reconciler{Client: mgr.GetClient(), Mapper: mgr.GetRESTMapper(), Store: store, Sync: engine, Builtins: builtins,
		Log: log.WithName("publish")}).SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("cannot set up the PublishedResource controller: %w", err)
	}
	handler := session.NewHandler(store, engine, pending)
	var renewer stream.Renewer
	if p.renewer != nil { // not a typed nil in the interface
		renewer = p.renewer
	}
	brokerStream := stream.New(stream.Options{
		BrokerAddress:     opts.BrokerAddress,
		TLS:               p.cfg.TLS,
		Dial:              p.cfg.Dialer.Dial,
		AgentName:         opts.AgentName,
		HeartbeatInterval: opts.HeartbeatInterval,
		MaxMessageBytes:   opts.MaxMessageBytes,
		Backoff:           &backoff.Exponential{Initial: opts.BackoffInitial, Max: opts.BackoffMax},
		StableAfter:       30 * time.Second,
		Handler:           handler,
		Log:               log,
		Metrics:           p.metrics,
		Renewer:           renewer,
	})
	state := &incarnationState{stream: brokerStream}
	p.current.Store(state)
	// A stopped incarnation leads no more (the next one stores its own).
	defer state.leading.Store(false)
	p.admin.SetSource(&edgeadmin.Source{Link: handler, Engine: engine, Objects: objects, Leading: state.leading.Load})
	p.metrics.SetSource(engine.MetricsState)

	// The broker link and the sync engine run only on the elected leader,
	// like the controllers: a standby replica neither connects nor writes.
	// They run behind a gate: after losing the lease controller-runtime skips
	// its graceful shutdown and returns without waiting for them, and the
	// next incarnation must not start beside them.
	var gate stopGate
	runStream := func(ctx context.Context) error {
		p.refreshCredentials(ctx) // a standby taking over: another replica may have renewed
		return brokerStream.Run(ctx)
	}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error { return gate.run(ctx, runStream) })); err != nil {
		return fmt.Errorf("cannot add the broker link to the manager: %w", err)
	}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		return gate.run(ctx, func(ctx context.Context) error { return engine.Run(ctx, 4) })
	})); err != nil {
		return fmt.Errorf("cannot add the sync engine to the manager: %w", err)
	}
	go func() {
		select {
		case <-mgr.Elected():
			state.leading.Store(true)
			log.Info("leading: connecting to the broker")
		case <-ctx.Done():
		}
	}()
	err = mgr.Start(ctx)

	// The controllers' workers are not waited for either; a reconcile still
	// running only touches this incarnation's store and engine, which are
	// dropped with it.
	stopCtx, stopCancel := context.WithTimeout(context.WithoutCancel(ctx), incarnationStopTimeout)
	defer stopCancel()
	if werr := gate.closeAndWait(stopCtx); werr != nil {
		// Not errLeadershipLost: with the old engine or link possibly still
		// running, only a new process is a clean start.
		return errors.Join(err, fmt.Errorf("the broker link and the sync engine did not stop within %s: %w", incarnationStopTimeout, werr))
	}
	if err != nil && lock != nil {
		if age, lost := lock.lost(opts.RenewDeadline); lost {
			return fmt.Errorf("%w (the lease was last renewed %s ago): %w", errLeadershipLost, age.Round(time.Millisecond), err)
		}
	}
	return err
}

// awaitAPIServer returns once the service cluster's API server answers
// /readyz, or with ctx's error. A new incarnation cannot lead before the API
// server is back (the Lease lives there), and setting it up needs API
// discovery, which fails while the server is away — waiting first keeps that
// failure from ending the process.
func awaitAPIServer(ctx context.Context, c rest.Interface, log logr.Logger) error {
	waiting := false
	for {
		probeCtx, cancel := context.WithTimeout(ctx, apiServerProbeTimeout)
		err := c.Get().AbsPath("/readyz").Do(probeCtx).Error()
		cancel()
		if err == nil {
			if waiting {
				log.Info("the service cluster's API server is ready again")
			}
			return nil
		}
		if !waiting {
			log.Info("waiting for the service cluster's API server", "err", err.Error())
			waiting = true
		}
		t := time.NewTimer(wait.Jitter(apiServerPollInterval, 1))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// observedLock is the Lease lock handed to controller-runtime, recording when
// this process last renewed the Lease.
//
// controller-runtime reports a lost Lease only as errors.New("leader election
// lost") on an internal channel (pkg/manager/internal.go: OnStoppedLeading);
// there is no exported error and its onStoppedLeading hook is unexported, so
// neither errors.Is nor a callback can tell that error from others. Matching
// the message would break silently when it is reworded. The lock sees what
// the elector sees, though: client-go gives up leadership exactly when no
// renewal succeeded for the renew deadline (its renew loop polls with that
// timeout, starting after the last success). So "held once, and not renewed
// for at least the renew deadline" is true whenever the elector gave up, and
// false while the Lease is fresh — a manager that fails for another reason
// with a fresh Lease still ends the process.
type observedLock struct {
	resourcelock.Interface

	mu      sync.Mutex
	renewed time.Time // last successful Create/Update naming us holder; zero before the first
	now     func() time.Time
}

// Create implements resourcelock.Interface.
func (l *observedLock) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Create(ctx, rec)
	l.observe(rec, err)
	return err
}

// Update implements resourcelock.Interface.
func (l *observedLock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	err := l.Interface.Update(ctx, rec)
	l.observe(rec, err)
	return err
}

// observe records a successful write that makes us the holder; releasing
// the Lease (an empty holder) is no renewal.
func (l *observedLock) observe(rec resourcelock.LeaderElectionRecord, err error) {
	if err != nil || rec.HolderIdentity != l.Identity() {
		return
	}
	l.mu.Lock()
	l.renewed = l.clock()
	l.mu.Unlock()
}

// lost reports whether the Lease was held and has not been renewed for at
// least renewDeadline, and how long ago it was last renewed.
func (l *observedLock) lost(renewDeadline time.Duration) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.renewed.IsZero() {
		return 0, false
	}
	age := l.clock().Sub(l.renewed)
	return age, age >= renewDeadline
}

func (l *observedLock) clock() time.Time {
	if l.now != nil {
		return l.now()
	}
	return time.Now()
}

// stopGate runs functions until it is closed and then waits for those still
// running. A function that would start after closeAndWait (the manager can
// start a runnable late) does not run at all.
type stopGate struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// run calls f with ctx unless the gate is closed.
func (g *stopGate) run(ctx context.Context, f func(context.Context) error) error {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.wg.Add(1)
	g.mu.Unlock()
	defer g.wg.Done()
	return f(ctx)
}

// closeAndWait closes the gate and waits until every running function
// returned, or returns ctx's error.
func (g *stopGate) closeAndWait(ctx context.Context) error {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	done := make(chan struct{})
	go func() {
		g.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
