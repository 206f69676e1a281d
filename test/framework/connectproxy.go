package framework

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ConnectProxy is a running test/cmd/connect-proxy.
type ConnectProxy struct {
	*Process
	// Address is its host:port.
	Address string
}

// StartConnectProxy starts the tests' HTTP CONNECT proxy on a free
// loopback port with args (--auth, --allow, --resolve, ...) and waits until
// it answers.
func StartConnectProxy(ctx context.Context, bins Binaries, name, logDir string, args ...string) (*ConnectProxy, error) {
	if bins.ConnectProxy == "" {
		return nil, fmt.Errorf("the connect-proxy binary is not known: set FERRY_BIN_DIR (make build-race builds it)")
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := StartProcess(name, bins.ConnectProxy, append([]string{"--listen", addr}, args...), nil, logDir)
	if err != nil {
		return nil, err
	}
	cp := &ConnectProxy{Process: p, Address: addr}
	err = Eventually(ctx, 30*time.Second, 50*time.Millisecond, func(ctx context.Context) (bool, string) {
		select {
		case <-p.Exited():
			return false, fmt.Sprintf("connect-proxy exited: %v", p.ExitErr())
		default:
		}
		if _, err := cp.Counts(ctx); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	if err != nil {
		_ = p.Stop(5 * time.Second)
		return nil, fmt.Errorf("connect-proxy not answering (log %s): %w", p.LogFile, err)
	}
	return cp, nil
}

// Counts reads the proxy's counters: accepted, refused, idle_closed.
func (p *ConnectProxy) Counts(ctx context.Context) (map[string]int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.Address+"/counts", nil)
	if err != nil {
		return nil, err
	}
	// A transport of its own: never through a proxy of the environment.
	resp, err := (&http.Transport{}).RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /counts: %s", resp.Status)
	}
	out := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(body)), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fmt.Errorf("GET /counts: unexpected line %q", line)
		}
		n, err := strconv.Atoi(value)
		if err != nil {
			return nil, fmt.Errorf("GET /counts: %q: %w", line, err)
		}
		out[name] = n
	}
	return out, nil
}
