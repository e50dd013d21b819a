package nodeagent

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// probeLoop runs a probe on the kubelet's schedule (initial delay, period,
// timeout, success and failure thresholds). A readiness probe sets the
// container's Ready flag; a failed liveness probe kills the container, which
// then restarts as its pod's restart policy says.
func (c *container) probeLoop(ctx context.Context, kind string, p *corev1.Probe, pid int, stop <-chan struct{}) {
	period := secondsOr(p.PeriodSeconds, 10)
	timeout := secondsOr(p.TimeoutSeconds, 1)
	successes, failures := int32(0), int32(0)
	needSuccess := max(p.SuccessThreshold, 1)
	needFailure := p.FailureThreshold
	if needFailure <= 0 {
		needFailure = 3
	}
	wait := time.Duration(p.InitialDelaySeconds) * time.Second
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = period
		err := c.probeOnce(ctx, p, pid, timeout)
		if err == nil {
			successes, failures = successes+1, 0
		} else {
			successes, failures = 0, failures+1
			if failures == 1 || failures == needFailure {
				c.w.event(corev1.EventTypeWarning, "Unhealthy", "%s probe failed: %v", kind, err)
			}
		}
		if kind == "Liveness" {
			if failures >= needFailure {
				c.w.event(corev1.EventTypeNormal, "Killing", "Container %s failed liveness probe, will be restarted", c.spec.Name)
				c.terminate(pid)
				return
			}
			continue
		}
		c.mu.Lock()
		was := c.ready
		if successes >= needSuccess {
			c.ready = true
		}
		if failures >= needFailure {
			c.ready = false
		}
		now := c.ready
		c.mu.Unlock()
		if was != now {
			c.w.publishStatus(ctx)
		}
	}
}

// terminate stops one run of the container: SIGTERM to its process group,
// SIGKILL after the pod's termination grace period.
func (c *container) terminate(pid int) {
	grace := 30 * time.Second
	if g := c.w.current().Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) {
		if syscall.Kill(pid, 0) != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}

func secondsOr(v int32, def int32) time.Duration {
	if v <= 0 {
		v = def
	}
	return time.Duration(v) * time.Second
}

func (c *container) probeOnce(ctx context.Context, p *corev1.Probe, pid int, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c.w.mu.Lock()
	podIP := c.w.addr.String()
	c.w.mu.Unlock()
	switch {
	case p.HTTPGet != nil:
		g := p.HTTPGet
		port, err := c.resolvePort(g.Port)
		if err != nil {
			return err
		}
		host := g.Host
		if host == "" {
			host = podIP
		}
		scheme := "http"
		if g.Scheme == corev1.URISchemeHTTPS {
			scheme = "https"
		}
		url := fmt.Sprintf("%s://%s%s", scheme, net.JoinHostPort(host, strconv.Itoa(port)), g.Path)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		for _, h := range g.HTTPHeaders {
			req.Header.Add(h.Name, h.Value)
		}
		// The kubelet does not verify a probe's TLS certificate.
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode < 200 || resp.StatusCode >= 400 {
			return fmt.Errorf("HTTP probe failed with statuscode: %d", resp.StatusCode)
		}
		return nil
	case p.TCPSocket != nil:
		port, err := c.resolvePort(p.TCPSocket.Port)
		if err != nil {
			return err
		}
		host := p.TCPSocket.Host
		if host == "" {
			host = podIP
		}
		var d net.Dialer
		conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return err
		}
		return conn.Close()
	case p.Exec != nil:
		out, err := execProbe(ctx, pid, p.Exec.Command, c.spec0.Env).CombinedOutput()
		if err != nil {
			return fmt.Errorf("exec probe %v: %v: %s", p.Exec.Command, err, out)
		}
		return nil
	}
	return fmt.Errorf("unsupported probe")
}

func (c *container) resolvePort(p intstr.IntOrString) (int, error) {
	if p.Type == intstr.Int {
		return p.IntValue(), nil
	}
	for _, cp := range c.spec.Ports {
		if cp.Name == p.StrVal {
			return int(cp.ContainerPort), nil
		}
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil {
		return n, nil
	}
	return 0, fmt.Errorf("container %s has no port named %q", c.spec.Name, p.StrVal)
}
