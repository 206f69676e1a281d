package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/test/framework"
)

// testDir is a directory for one test's files, kept with the run's artifacts.
func testDir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join(env.dir, "tests", sanitize(t.Name()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func sanitize(s string) string {
	return strings.Trim(regexp.MustCompile(`[^a-z0-9]+`).ReplaceAllString(strings.ToLower(s), "-"), "-")
}

// newExport creates an APIExport unique to the test in the provider
// workspace.
func newExport(t testing.TB) config.APIExportRef {
	t.Helper()
	name := sanitize(t.Name()) + ".e2e.ferry.dev"
	if err := framework.CreateAPIExport(context.Background(), env.kcp.Config, env.provider, name); err != nil {
		t.Fatal(err)
	}
	return config.APIExportRef{Workspace: env.provider.String(), Name: name}
}

// newPKI makes a development PKI for the test with the given clients.
func newPKI(t testing.TB, name string, clients ...string) string {
	t.Helper()
	dir := filepath.Join(testDir(t), name)
	if err := framework.MakePKI(context.Background(), env.bins, dir, clients...); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startBroker starts a broker for the test and registers its cleanup.
func startBroker(t testing.TB, pkiDir string, cfg config.Config, extraArgs ...string) *framework.Broker {
	t.Helper()
	dir := testDir(t)
	b, err := framework.StartBroker(context.Background(), env.bins, framework.BrokerOptions{
		Dir: dir, LogDir: dir, PKIDir: pkiDir, KCPKubeconfig: env.kcp.StableKubeconfig, Config: cfg, ExtraArgs: extraArgs,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopChecked(t, b.Process) })
	return b
}

// startEdge starts an edge with pkiDir's client certificate and registers
// its cleanup.
func startEdge(t testing.TB, name, pkiDir, client, brokerAddress string, extraArgs ...string) *framework.Process {
	t.Helper()
	o := framework.EdgeOptionsFor(pkiDir, client)
	o.Name, o.LogDir, o.BrokerAddress, o.Kubeconfig = name, testDir(t), brokerAddress, env.service.Kubeconfig
	o.ExtraArgs = append([]string{"--heartbeat-interval", "1s"}, extraArgs...)
	p, err := framework.StartEdge(env.bins, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopChecked(t, p) })
	return p
}

// stopChecked stops p with SIGTERM and fails the test when it does not exit
// cleanly or its log reports a data race (the binaries are built with
// -race).
func stopChecked(t testing.TB, p *framework.Process) {
	t.Helper()
	if p.Killed() {
		return // killed on purpose by the test
	}
	if err := p.Stop(20 * time.Second); err != nil {
		t.Errorf("%s did not shut down cleanly on SIGTERM: %v (log %s)", p.Name, err, p.LogFile)
	} else if err := p.ExitErr(); err != nil {
		// ferry's binaries handle SIGTERM and exit 0; dying of the signal
		// means the handler is missing.
		t.Errorf("%s did not exit 0 after SIGTERM: %v (log %s)", p.Name, err, p.LogFile)
	}
	if log, err := p.Log(); err == nil && strings.Contains(string(log), "WARNING: DATA RACE") {
		t.Errorf("%s reported a data race (log %s)", p.Name, p.LogFile)
	}
	if t.Failed() {
		// CI keeps the test output, not always the artifacts: the end of
		// the log says what the process was doing when the test failed.
		t.Logf("last lines of %s (pid %d):\n%s", p.Name, p.Pid(), logTail(p, 15, 300))
	}
}

// logTail returns the last n lines of p's log that are not debug lines, each
// cut to width characters.
func logTail(p *framework.Process, n, width int) string {
	data, err := p.Log()
	if err != nil {
		return err.Error()
	}
	var lines []string
	for _, line := range strings.Split(strings.TrimRight(string(data), "\n"), "\n") {
		if strings.Contains(line, `"level":"debug"`) {
			continue
		}
		if len(line) > width {
			line = line[:width] + "…"
		}
		lines = append(lines, "    "+line)
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitLog waits until p's log contains all of substrs on one line.
func waitLog(t testing.TB, p *framework.Process, timeout time.Duration, substrs ...string) string {
	t.Helper()
	var found string
	err := framework.Eventually(context.Background(), timeout, 100*time.Millisecond, func(context.Context) (bool, string) {
		data, err := p.Log()
		if err != nil {
			return false, err.Error()
		}
		for _, line := range strings.Split(string(data), "\n") {
			if containsAll(line, substrs) {
				found = line
				return true, ""
			}
		}
		return false, fmt.Sprintf("no line of %s contains all of %q", p.LogFile, substrs)
	})
	if err != nil {
		select {
		case <-p.Exited():
			t.Fatalf("%v; %s had exited (%v)", err, p.Name, p.ExitErr())
		default:
		}
		t.Fatal(err)
	}
	return found
}

// waitLogCount waits until at least n lines of p's log contain all of substrs.
func waitLogCount(t testing.TB, p *framework.Process, timeout time.Duration, n int, substrs ...string) {
	t.Helper()
	err := framework.Eventually(context.Background(), timeout, 100*time.Millisecond, func(context.Context) (bool, string) {
		data, err := p.Log()
		if err != nil {
			return false, err.Error()
		}
		count := 0
		for _, line := range strings.Split(string(data), "\n") {
			if containsAll(line, substrs) {
				count++
			}
		}
		return count >= n, fmt.Sprintf("%d of %d lines of %s contain all of %q", count, n, p.LogFile, substrs)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// adminConn dials the broker with the admin client certificate.
func adminConn(t testing.TB, b *framework.Broker, pkiDir string) *grpc.ClientConn {
	t.Helper()
	conn, err := framework.DialBroker(b.Address, pkiDir, "admin")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// assertLogLacks fails when p's log file contains substr (also in what an
// earlier process of the same name wrote).
func assertLogLacks(t testing.TB, p *framework.Process, substr string) {
	t.Helper()
	data, err := os.ReadFile(p.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), substr) {
		t.Errorf("%s log contains %q, which must not happen (log %s)", p.Name, substr, p.LogFile)
	}
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// brokerFor starts a broker serving a fresh APIExport for the client
// certificate "edge" (and "admin" for the admin API) of a new PKI.
func brokerFor(t testing.TB, brokerArgs ...string) (pki string, export config.APIExportRef, broker *framework.Broker) {
	t.Helper()
	export = newExport(t)
	pki = newPKI(t, "pki", "edge", "admin")
	broker = startBroker(t, pki, config.Config{
		Edges:  []config.Edge{{Identity: devpki.IdentityFor("edge"), APIExport: export}},
		Admins: []string{devpki.IdentityFor("admin")},
	}, brokerArgs...)
	return pki, export, broker
}
