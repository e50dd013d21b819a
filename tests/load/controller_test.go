package load

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubefill/kubefill/tests/cluster"
)

const (
	// installNS is the controller's install namespace.
	installNS = "kubefill-load"
	// workerImage is the image the node has (hack/images.sh).
	workerImage = "kubefill/kubefill:dev"

	// idleAfter is how long after the last change the controller must have
	// gone quiet ("settles within a minute").
	idleAfter = time.Minute
	// idleWindow is how long its request rate is measured over then.
	idleWindow = 30 * time.Second
	// maxIdleRate is the request rate to kube-apiserver (requests/s,
	// watches included) a quiet controller stays under. With nothing
	// changing a controller-runtime manager only re-opens its watches (each
	// informer every 5-10 minutes: ~20 informers make ~0.05/s) and the
	// certificate controller reads its chains once a minute (9 reads
	// measured: 0.15/s on average, 0.3/s in a 30 s window holding one
	// check). 0.5/s, one request every two seconds, leaves room for that,
	// while one object requeued in a loop (a read and a status write every
	// few seconds) goes over it.
	maxIdleRate = 0.5
)

// controllerProcess is `kubefill controller` running as a process of its own,
// as in an install, with its metrics on a loopback port.
type controllerProcess struct {
	cmd        *exec.Cmd
	metricsURL string
	logFile    string
	started    time.Time
	done       chan struct{}
	waitErr    error
}

// startController runs the built kubefill binary's controller against the
// cluster, and stops it (SIGTERM, then SIGKILL) when the test ends.
func startController(t *testing.T) *controllerProcess {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: installNS}}
	if _, err := cl.Client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", installNS, err)
	}
	metricsPort, err := cluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	probePort, err := cluster.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(t.TempDir(), "kubefill-controller.log")
	out, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	metricsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(metricsPort))
	cmd := exec.Command(kubefillBin, "controller",
		"--kubeconfig="+cl.Kubeconfig,
		"--install-namespace="+installNS,
		"--leader-elect=false",
		"--metrics-bind-address="+metricsAddr,
		"--health-probe-bind-address="+net.JoinHostPort("127.0.0.1", strconv.Itoa(probePort)),
		"--worker-image="+workerImage,
		// Nothing serves Kubefill's API here: no certificate to keep for it.
		"--apiserver-certificates=false",
	)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start kubefill controller: %v", err)
	}
	p := &controllerProcess{cmd: cmd, metricsURL: "http://" + metricsAddr + "/metrics", logFile: logFile,
		started: time.Now(), done: make(chan struct{})}
	go func() { p.waitErr = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("controller log (last lines):\n%s", tailFile(logFile, 40))
		}
	})
	t.Logf("kubefill controller running, pid %d, metrics %s, log %s", cmd.Process.Pid, p.metricsURL, logFile)
	return p
}

// stop ends the controller: SIGTERM, and SIGKILL after 10 s.
func (p *controllerProcess) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// alive fails the test when the controller has exited.
func (p *controllerProcess) alive(t *testing.T) {
	t.Helper()
	select {
	case <-p.done:
		t.Fatalf("kubefill controller exited (%v):\n%s", p.waitErr, tailFile(p.logFile, 40))
	default:
	}
}

// memory reads the controller's resident set now and its peak (VmRSS and
// VmHWM of /proc/<pid>/status), in bytes.
func (p *controllerProcess) memory(t *testing.T) (rss, peak int64) {
	t.Helper()
	p.alive(t)
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatalf("read the controller's memory: %v", err)
	}
	rss, peak = -1, -1
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		kb, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "VmRSS:":
			rss = kb << 10
		case "VmHWM:":
			peak = kb << 10
		}
	}
	if rss < 0 || peak < 0 {
		t.Fatalf("no VmRSS/VmHWM in /proc/%d/status", p.cmd.Process.Pid)
	}
	return rss, peak
}

// requests sums the controller's rest_client_requests_total by method (its
// requests to kube-apiserver, as client-go counts them) and its
// workqueue_adds_total by controller (what it reconciled), as
// "request:GET" and "reconcile:datavolume" keys.
func (p *controllerProcess) requests(t *testing.T) map[string]float64 {
	t.Helper()
	p.alive(t)
	var body string
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := scrape(p.metricsURL)
		if err == nil {
			body = b
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("scrape the controller's metrics: %v", err)
		}
		time.Sleep(time.Second)
	}
	reqs, err := sumBy(body, "rest_client_requests_total", "method")
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) == 0 {
		t.Fatalf("no rest_client_requests_total in the controller's metrics")
	}
	adds, err := sumBy(body, "workqueue_adds_total", "name")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for k, v := range reqs {
		out["request:"+k] = v
	}
	for k, v := range adds {
		out["reconcile:"+k] = v
	}
	return out
}

func scrape(url string) (string, error) {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}

// sumBy sums the samples of a counter in a Prometheus text exposition by
// one of its labels. Pure.
func sumBy(body, metric, label string) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, metric+"{") {
			continue
		}
		end := strings.LastIndex(line, "}")
		f := strings.Fields(line[end+1:])
		if end < 0 || len(f) == 0 {
			return nil, fmt.Errorf("bad sample %q", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("bad sample %q: %w", line, err)
		}
		key := "?"
		for _, kv := range strings.Split(line[len(metric)+1:end], ",") {
			if k, val, ok := strings.Cut(kv, "="); ok && k == label {
				key = strings.Trim(val, `"`)
			}
		}
		out[key] += v
	}
	return out, sc.Err()
}

// heap is the controller's Go heap in use and the memory the Go runtime
// holds from the OS (go_memstats_heap_inuse_bytes, go_memstats_sys_bytes),
// in MiB, to tell live objects from garbage not yet collected or returned.
func (p *controllerProcess) heap(t *testing.T) string {
	t.Helper()
	body, err := scrape(p.metricsURL)
	if err != nil {
		return fmt.Sprintf("(metrics: %v)", err)
	}
	var parts []string
	for _, name := range []string{"go_memstats_heap_inuse_bytes", "go_memstats_heap_idle_bytes", "go_memstats_heap_released_bytes", "go_memstats_sys_bytes"} {
		for _, line := range strings.Split(body, "\n") {
			if f := strings.Fields(line); len(f) == 2 && f[0] == name {
				v, _ := strconv.ParseFloat(f[1], 64)
				parts = append(parts, fmt.Sprintf("%s %.1f MiB", strings.TrimSuffix(strings.TrimPrefix(name, "go_memstats_"), "_bytes"), v/(1<<20)))
			}
		}
	}
	return strings.Join(parts, ", ")
}

// total sums the keys of m that start with prefix.
func total(m map[string]float64, prefix string) float64 {
	var s float64
	for k, v := range m {
		if strings.HasPrefix(k, prefix) {
			s += v
		}
	}
	return s
}

// diff is after minus before, by method, leaving out methods that did not
// change, formatted "GET=3 PUT=1".
func diff(before, after map[string]float64) string {
	var parts []string
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			parts = append(parts, fmt.Sprintf("%s=%.0f", k, d))
		}
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " ")
}

// assertQuiet waits until idleAfter has passed since since (the last
// change the test made), then measures the controller's request rate over
// idleWindow and fails the test when it is over maxIdleRate.
func (p *controllerProcess) assertQuiet(t *testing.T, what string, since time.Time) float64 {
	t.Helper()
	if wait := time.Until(since.Add(idleAfter)); wait > 0 {
		time.Sleep(wait)
	}
	before := p.requests(t)
	t0 := time.Now()
	time.Sleep(idleWindow)
	after := p.requests(t)
	elapsed := time.Since(t0)
	rate := (total(after, "request:") - total(before, "request:")) / elapsed.Seconds()
	fmt.Printf("load: %s: idle request rate %.3f req/s (%s after the last change, over %s: %s; goal < %.1f)\n",
		what, rate, idleAfter, elapsed.Round(time.Second), diff(before, after), maxIdleRate)
	if rate >= maxIdleRate {
		t.Errorf("%s: with nothing changing the controller still makes %.3f requests/s to kube-apiserver %s on (%s in %s); want < %.1f: a reconcile loop?\n%s",
			what, rate, idleAfter, diff(before, after), elapsed.Round(time.Second), maxIdleRate, tailFile(p.logFile, 30))
	}
	return rate
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
