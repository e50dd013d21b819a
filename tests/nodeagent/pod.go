package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const (
	volumeRetryInterval = 250 * time.Millisecond
	maxBackoff          = 10 * time.Second
)

// podWorker runs one pod from start to deletion.
type podWorker struct {
	a   *Agent
	uid types.UID
	dir string

	mu         sync.Mutex
	pod        *corev1.Pod // latest object seen
	changed    chan struct{}
	deleting   bool // deletionTimestamp set: stop with grace
	gone       bool // object removed from the API
	stopNow    chan struct{}
	stopOnce   sync.Once
	ctrs       []*container
	initDone   bool
	sandbox    bool
	netns      string
	addr       netip.Addr
	volumes    map[string]podVolume
	statusMu   sync.Mutex
	lastStatus string
}

func newPodWorker(a *Agent, pod *corev1.Pod) *podWorker {
	return &podWorker{
		a:       a,
		uid:     pod.UID,
		dir:     a.podDir(pod.UID),
		pod:     pod,
		changed: make(chan struct{}, 1),
		stopNow: make(chan struct{}),
	}
}

func (w *podWorker) logf(format string, args ...any) {
	w.mu.Lock()
	p := w.pod
	w.mu.Unlock()
	w.a.cfg.Logf("pod %s/%s: "+format, append([]any{p.Namespace, p.Name}, args...)...)
}

func (w *podWorker) notify() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

func (w *podWorker) update(pod *corev1.Pod) {
	w.mu.Lock()
	w.pod = pod
	if pod.DeletionTimestamp != nil {
		w.deleting = true
	}
	w.mu.Unlock()
	w.notify()
}

func (w *podWorker) removed() {
	w.mu.Lock()
	w.gone, w.deleting = true, true
	w.mu.Unlock()
	w.shutdown()
	w.notify()
}

// shutdown kills the pod's containers at once (agent exit, pod removed).
func (w *podWorker) shutdown() {
	w.stopOnce.Do(func() { close(w.stopNow) })
	w.notify()
}

func (w *podWorker) current() *corev1.Pod {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pod
}

func (w *podWorker) isDeleting() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deleting
}

func (w *podWorker) event(eventType, reason, format string, args ...any) {
	w.a.recorder.Eventf(w.current(), eventType, reason, format, args...)
}

// run is the pod's life: network, volumes, init containers, containers,
// then, on deletion or termination, the reverse.
func (w *podWorker) run(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-w.stopNow:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := w.start(ctx)
	if err != nil && !errors.Is(err, errPodGone) {
		w.logf("start: %v", err)
	}
	// Wait until the pod is being deleted or has finished for good.
	for {
		if w.isDeleting() || ctx.Err() != nil {
			break
		}
		if w.terminal() {
			w.logf("finished: %s", w.phase())
			w.releaseResources()
		}
		select {
		case <-w.changed:
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
		// A status write that failed (conflicts, a loaded apiserver) is
		// retried here; an unchanged status costs one GET and no write.
		w.publishStatus(ctx)
	}
	w.stopContainers()
	w.releaseResources()
	w.mu.Lock()
	gone := w.gone
	w.mu.Unlock()
	if !gone && w.isDeleting() {
		w.publishStatus(context.Background())
		w.a.finalDelete(context.Background(), w.current())
	}
	_ = os.RemoveAll(filepath.Join(w.dir, "roots"))
}

func (w *podWorker) start(ctx context.Context) error {
	pod := w.current()
	if err := os.MkdirAll(w.dir, 0o755); err != nil {
		return err
	}
	// Every container's image must be known here, as a kubelet pulls all
	// images before it starts a pod's containers.
	w.ctrs = nil
	for i := range pod.Spec.InitContainers {
		w.ctrs = append(w.ctrs, newContainer(w, &pod.Spec.InitContainers[i], true))
	}
	for i := range pod.Spec.Containers {
		w.ctrs = append(w.ctrs, newContainer(w, &pod.Spec.Containers[i], false))
	}
	badImage := false
	for _, c := range w.ctrs {
		img, ok := w.a.cfg.Images.Resolve(c.spec.Image)
		if !ok {
			badImage = true
			msg := fmt.Sprintf("image %q is not known to the kubefill node agent (it maps images to local executables)", c.spec.Image)
			c.setWaiting("ErrImagePull", msg)
			w.event(corev1.EventTypeWarning, "Failed", "Failed to pull image %q: %s", c.spec.Image, msg)
			continue
		}
		c.image = img
		w.event(corev1.EventTypeNormal, "Pulled", "Container image %q already present on machine", c.spec.Image)
	}
	w.publishStatus(ctx)
	if badImage {
		return errors.New("unknown image")
	}

	ns, addr, err := w.a.net.setup(string(w.uid))
	if err != nil {
		w.event(corev1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod network: %v", err)
		return err
	}
	w.mu.Lock()
	w.netns, w.addr, w.sandbox = ns, addr, true
	w.mu.Unlock()
	w.publishStatus(ctx)

	retryIn := volumeRetryInterval
	for {
		vols, err := w.setupVolumes(ctx, w.current())
		if err == nil {
			w.mu.Lock()
			w.volumes = vols
			w.mu.Unlock()
			break
		}
		w.event(corev1.EventTypeWarning, "FailedMount", "%v", err)
		w.logf("volumes: %v", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(retryIn):
		}
		// Retry quickly at first (a claim is often bound a moment later),
		// then back off as the kubelet does.
		retryIn = min(retryIn*2, 8*time.Second)
		if w.isDeleting() {
			return errPodGone
		}
	}

	// Init containers run one after another, each to success.
	for _, c := range w.ctrs {
		if !c.init {
			continue
		}
		if err := c.prepare(ctx); err != nil {
			return w.failContainer(c, err)
		}
		c.run(ctx)
		if c.exitCode() != 0 || w.isDeleting() {
			return errors.New("init container failed")
		}
	}
	w.mu.Lock()
	w.initDone = true
	w.mu.Unlock()
	w.publishStatus(ctx)
	for _, c := range w.ctrs {
		if c.init {
			continue
		}
		if err := c.prepare(ctx); err != nil {
			return w.failContainer(c, err)
		}
		go c.run(ctx)
	}
	return nil
}

func (w *podWorker) failContainer(c *container, err error) error {
	c.setWaiting("CreateContainerConfigError", err.Error())
	w.event(corev1.EventTypeWarning, "Failed", "Error: %v", err)
	w.publishStatus(context.Background())
	return err
}

func (w *podWorker) views() []ctrView {
	var out []ctrView
	for _, c := range w.ctrs {
		if !c.init {
			out = append(out, c.view())
		}
	}
	return out
}

func (w *podWorker) phase() corev1.PodPhase {
	w.mu.Lock()
	initDone := w.initDone
	w.mu.Unlock()
	// An init container that failed for good fails the pod.
	for _, c := range w.ctrs {
		if c.init {
			v := c.view()
			if v.terminated && !v.willRestart && v.exitCode != 0 {
				return corev1.PodFailed
			}
		}
	}
	return podPhase(initDone, w.views())
}

func (w *podWorker) terminal() bool {
	p := w.phase()
	return p == corev1.PodSucceeded || p == corev1.PodFailed
}

// stopContainers kills every container: SIGTERM, then SIGKILL after the
// pod's grace period (zero when the agent shuts down or the pod is gone).
func (w *podWorker) stopContainers() {
	grace := 30 * time.Second
	p := w.current()
	if p.DeletionGracePeriodSeconds != nil {
		grace = time.Duration(*p.DeletionGracePeriodSeconds) * time.Second
	} else if p.Spec.TerminationGracePeriodSeconds != nil {
		grace = time.Duration(*p.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	select {
	case <-w.stopNow:
		grace = 0
	default:
	}
	var wg sync.WaitGroup
	for _, c := range w.ctrs {
		wg.Add(1)
		go func(c *container) {
			defer wg.Done()
			c.kill(grace)
		}(c)
	}
	wg.Wait()
}

// releaseResources unpublishes volumes and removes the network namespace;
// it runs once the pod's containers are all gone.
func (w *podWorker) releaseResources() {
	w.mu.Lock()
	vols, ns, addr := w.volumes, w.netns, w.addr
	w.volumes, w.netns, w.addr, w.sandbox = nil, "", netip.Addr{}, false
	w.mu.Unlock()
	if vols != nil {
		w.teardownVolumes(vols)
	}
	if ns != "" {
		if err := w.a.net.teardown(ns, addr); err != nil {
			w.logf("%v", err)
		}
	}
}

// publishStatus writes the pod's status to the API when it changed.
func (w *podWorker) publishStatus(ctx context.Context) {
	w.statusMu.Lock()
	defer w.statusMu.Unlock()
	for attempt := 0; attempt < 5; attempt++ {
		pod, err := w.a.client.CoreV1().Pods(w.current().Namespace).Get(ctx, w.current().Name, metav1.GetOptions{})
		if err != nil {
			if !apierrors.IsNotFound(err) && ctx.Err() == nil {
				w.logf("get for status: %v", err)
			}
			return
		}
		if pod.UID != w.uid {
			return
		}
		status := w.buildStatus(pod)
		key, _ := json.Marshal(stripTimes(status))
		if string(key) == w.lastStatus {
			return
		}
		pod.Status = status
		_, err = w.a.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		if err == nil {
			w.lastStatus = string(key)
			return
		}
		if !apierrors.IsConflict(err) {
			if ctx.Err() == nil && !apierrors.IsNotFound(err) {
				w.logf("update status: %v", err)
			}
			return
		}
	}
}

// stripTimes drops heartbeat-like fields so that only real changes count.
func stripTimes(s corev1.PodStatus) corev1.PodStatus {
	s = *s.DeepCopy()
	for i := range s.Conditions {
		s.Conditions[i].LastTransitionTime = metav1.Time{}
		s.Conditions[i].LastProbeTime = metav1.Time{}
	}
	return s
}

func (w *podWorker) buildStatus(pod *corev1.Pod) corev1.PodStatus {
	w.mu.Lock()
	sandbox, initDone, addr := w.sandbox, w.initDone, w.addr
	w.mu.Unlock()
	phase := w.phase()
	st := corev1.PodStatus{
		Phase:     phase,
		HostIP:    w.a.net.gateway.String(),
		HostIPs:   []corev1.HostIP{{IP: w.a.net.gateway.String()}},
		StartTime: pod.Status.StartTime,
		QOSClass:  pod.Status.QOSClass,
	}
	if st.StartTime == nil {
		now := metav1.Now()
		st.StartTime = &now
	}
	if addr.IsValid() {
		st.PodIP = addr.String()
		st.PodIPs = []corev1.PodIP{{IP: addr.String()}}
	} else if pod.Status.PodIP != "" && (phase == corev1.PodSucceeded || phase == corev1.PodFailed) {
		// A finished pod keeps reporting the address it had.
		st.PodIP, st.PodIPs = pod.Status.PodIP, pod.Status.PodIPs
	}
	for _, c := range w.ctrs {
		cs := c.status()
		if c.init {
			st.InitContainerStatuses = append(st.InitContainerStatuses, cs)
		} else {
			st.ContainerStatuses = append(st.ContainerStatuses, cs)
		}
	}
	st.Conditions = podConditions(pod.Status.Conditions, metav1.Now(), sandbox, initDone, phase, w.views())
	return st
}

// container is one container of a pod and its restarts.
type container struct {
	w     *podWorker
	spec  *corev1.Container
	init  bool
	image Image
	dir   string

	mu        sync.Mutex
	state     corev1.ContainerState
	last      corev1.ContainerState
	restarts  int32
	started   bool
	ready     bool
	willRerun bool
	proc      *os.Process
	stopping  bool
	done      chan struct{}
	running   bool
	spec0     *InitSpec
	probeStop chan struct{}
}

func newContainer(w *podWorker, spec *corev1.Container, init bool) *container {
	c := &container{w: w, spec: spec, init: init, dir: filepath.Join(w.dir, "containers", spec.Name), done: make(chan struct{})}
	c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}
	if init {
		c.state.Waiting.Reason = "PodInitializing"
	}
	return c
}

func (c *container) setWaiting(reason, msg string) {
	c.mu.Lock()
	c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
	c.mu.Unlock()
}

func (c *container) view() ctrView {
	c.mu.Lock()
	defer c.mu.Unlock()
	v := ctrView{started: c.started, running: c.state.Running != nil, ready: c.ready, willRestart: c.willRerun}
	if t := c.state.Terminated; t != nil {
		v.terminated, v.exitCode = true, t.ExitCode
	}
	if c.state.Waiting != nil && c.last.Terminated != nil {
		// Backing off before a restart.
		v.exitCode = c.last.Terminated.ExitCode
	}
	return v
}

func (c *container) exitCode() int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state.Terminated != nil {
		return c.state.Terminated.ExitCode
	}
	return -1
}

func (c *container) status() corev1.ContainerStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	started := c.state.Running != nil
	return corev1.ContainerStatus{
		Name:                 c.spec.Name,
		Image:                c.spec.Image,
		ImageID:              "kubefill-nodeagent://" + c.spec.Image,
		ContainerID:          fmt.Sprintf("kubefill-nodeagent://%s-%s-%d", c.w.uid, c.spec.Name, c.restarts),
		State:                *c.state.DeepCopy(),
		LastTerminationState: *c.last.DeepCopy(),
		Ready:                c.ready,
		RestartCount:         c.restarts,
		Started:              &started,
	}
}

// prepare resolves the container's environment, command and mounts.
func (c *container) prepare(ctx context.Context) error {
	pod := c.w.current().DeepCopy()
	c.w.mu.Lock()
	pod.Status.PodIP = c.w.addr.String()
	pod.Status.PodIPs = []corev1.PodIP{{IP: pod.Status.PodIP}}
	pod.Status.HostIP = c.w.a.net.gateway.String()
	vols := c.w.volumes
	c.w.mu.Unlock()
	env, err := containerEnv(pod, c.spec, apiGetter{ctx: ctx, a: c.w.a})
	if err != nil {
		return err
	}
	env = append([]string{"HOSTNAME=" + pod.Name}, env...)
	argv, err := commandLine(c.spec, c.image, env)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.dir, 0o755); err != nil {
		return err
	}
	mounts, err := c.w.containerMounts(pod, c, vols)
	if err != nil {
		return err
	}
	hostname := pod.Name
	if pod.Spec.Hostname != "" {
		hostname = pod.Spec.Hostname
	}
	if len(hostname) > 63 {
		hostname = hostname[:63]
	}
	id, err := containerIdentity(pod, c.spec)
	if err != nil {
		return err
	}
	c.spec0 = &InitSpec{Argv: argv, Env: env, WorkingDir: c.spec.WorkingDir, Mounts: mounts, Hostname: hostname, Identity: id}
	return nil
}

// terminationLog is the host file bound at the container's
// terminationMessagePath.
func (c *container) terminationLog() string { return filepath.Join(c.dir, "termination-log") }

// LogFile is where a container run's output goes: <dir>/<restart>.log, with
// current.log pointing at the latest.
func (c *container) logFile(restart int32) string {
	return filepath.Join(c.dir, fmt.Sprintf("%d.log", restart))
}

// run starts the container and restarts it as the pod's policy says, until
// it is done for good or the pod stops.
func (c *container) run(ctx context.Context) {
	defer close(c.done)
	backoff := time.Second
	for {
		c.mu.Lock()
		if c.stopping {
			c.mu.Unlock()
			return
		}
		restart := c.restarts
		c.mu.Unlock()
		code, err := c.runOnce(ctx, restart)
		if err != nil {
			c.setWaiting("RunContainerError", err.Error())
			c.w.event(corev1.EventTypeWarning, "Failed", "Error: %v", err)
			c.w.publishStatus(ctx)
			code = 128
		}
		c.mu.Lock()
		again := restarts(c.w.current().Spec.RestartPolicy, code, c.init) && !c.stopping && ctx.Err() == nil
		c.willRerun = again
		c.mu.Unlock()
		c.w.publishStatus(ctx)
		c.w.notify()
		if !again {
			return
		}
		c.mu.Lock()
		c.last = c.state
		c.state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
			Reason:  "CrashLoopBackOff",
			Message: fmt.Sprintf("back-off %s restarting failed container=%s pod=%s", backoff, c.spec.Name, c.w.current().Name),
		}}
		c.mu.Unlock()
		c.w.event(corev1.EventTypeWarning, "BackOff", "Back-off restarting failed container %s", c.spec.Name)
		c.w.publishStatus(ctx)
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, maxBackoff)
		c.mu.Lock()
		c.restarts++
		c.willRerun = false
		c.mu.Unlock()
	}
}

func (c *container) runOnce(ctx context.Context, restart int32) (int32, error) {
	root := filepath.Join(c.w.dir, "roots", fmt.Sprintf("%s-%d", c.spec.Name, restart))
	if err := os.MkdirAll(root, 0o755); err != nil {
		return 0, err
	}
	spec := *c.spec0
	spec.Root = root
	spec.Mounts = append([]InitMount(nil), spec.Mounts...)
	if err := os.WriteFile(c.terminationLog(), nil, 0o666); err != nil {
		return 0, err
	}
	// Any user the container runs as may write its termination message.
	if err := os.Chmod(c.terminationLog(), 0o666); err != nil {
		return 0, err
	}
	tmPath := c.spec.TerminationMessagePath
	if tmPath == "" {
		tmPath = corev1.TerminationMessagePathDefault
	}
	spec.Mounts = append(spec.Mounts, InitMount{Source: c.terminationLog(), Target: tmPath, File: true})
	for name, host := range c.image.Binaries {
		spec.Mounts = append(spec.Mounts, InitMount{Source: host, Target: imageBinDir + "/" + name, File: true, ReadOnly: true})
	}
	specFile := filepath.Join(c.dir, fmt.Sprintf("spec-%d.json", restart))
	data, err := json.Marshal(spec)
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(specFile, data, 0o600); err != nil {
		return 0, err
	}
	logPath := c.logFile(restart)
	out, err := os.Create(logPath)
	if err != nil {
		return 0, err
	}
	defer out.Close()
	_ = os.Remove(filepath.Join(c.dir, "current.log"))
	_ = os.Symlink(filepath.Base(logPath), filepath.Join(c.dir, "current.log"))

	c.w.mu.Lock()
	ns := c.w.netns
	c.w.mu.Unlock()
	if ns == "" {
		return 0, errors.New("pod network is gone")
	}
	cmd := exec.Command("ip", "netns", "exec", ns, c.w.a.cfg.HelperBinary, "pod-init", "--spec", specFile)
	cmd.Stdout, cmd.Stderr = out, out
	// Its own UTS namespace gives the container the pod's hostname, its own
	// IPC namespace keeps it from the host's SysV objects.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL,
		Cloneflags: syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC}
	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		return 0, errors.New("stopping")
	}
	if err := cmd.Start(); err != nil {
		c.mu.Unlock()
		return 0, fmt.Errorf("start container %s: %w", c.spec.Name, err)
	}
	started := metav1.Now()
	c.proc = cmd.Process
	c.state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}}
	c.started = true
	c.ready = c.spec.ReadinessProbe == nil && !c.init
	c.probeStop = make(chan struct{})
	probeStop := c.probeStop
	c.mu.Unlock()
	c.w.event(corev1.EventTypeNormal, "Created", "Created container: %s", c.spec.Name)
	c.w.event(corev1.EventTypeNormal, "Started", "Started container %s", c.spec.Name)
	c.w.publishStatus(ctx)
	if c.spec.ReadinessProbe != nil && !c.init {
		go c.probeLoop(ctx, "Readiness", c.spec.ReadinessProbe, cmd.Process.Pid, probeStop)
	}
	if c.spec.LivenessProbe != nil && !c.init {
		go c.probeLoop(ctx, "Liveness", c.spec.LivenessProbe, cmd.Process.Pid, probeStop)
	}

	werr := cmd.Wait()
	close(probeStop)
	code := int32(0)
	if werr != nil {
		var ee *exec.ExitError
		if !errors.As(werr, &ee) {
			return 0, werr
		}
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int32(ws.Signal())
		} else {
			code = int32(ee.ExitCode())
		}
	}
	msg := c.terminationMessage(code, logPath)
	reason := "Completed"
	if code != 0 {
		reason = "Error"
	}
	c.mu.Lock()
	c.proc = nil
	c.ready = false
	c.state = corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: code, Reason: reason, Message: msg, StartedAt: started, FinishedAt: metav1.Now(),
		ContainerID: fmt.Sprintf("kubefill-nodeagent://%s-%s-%d", c.w.uid, c.spec.Name, restart),
	}}
	c.mu.Unlock()
	c.w.logf("container %s exited with %d", c.spec.Name, code)
	return code, nil
}

// terminationMessage reads what the container wrote to its
// terminationMessagePath, or the tail of its log when the policy asks for it.
func (c *container) terminationMessage(code int32, logPath string) string {
	data, _ := os.ReadFile(c.terminationLog())
	if len(data) > terminationLogLimit {
		data = data[:terminationLogLimit]
	}
	if len(data) == 0 && code != 0 && c.spec.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError {
		logData, _ := os.ReadFile(logPath)
		lines := strings.Split(strings.TrimRight(string(logData), "\n"), "\n")
		if len(lines) > 80 {
			lines = lines[len(lines)-80:]
		}
		data = []byte(strings.Join(lines, "\n"))
		if len(data) > 2048 {
			data = data[len(data)-2048:]
		}
	}
	return string(data)
}

// kill stops the container: SIGTERM to its process group, SIGKILL after
// grace, and waits for its run loop to end.
func (c *container) kill(grace time.Duration) {
	c.mu.Lock()
	c.stopping = true
	proc := c.proc
	wasStarted := c.started
	c.mu.Unlock()
	if proc != nil {
		c.w.event(corev1.EventTypeNormal, "Killing", "Stopping container %s", c.spec.Name)
		_ = syscall.Kill(-proc.Pid, syscall.SIGTERM)
		select {
		case <-c.done:
			return
		case <-time.After(grace):
		}
		_ = syscall.Kill(-proc.Pid, syscall.SIGKILL)
	}
	if wasStarted {
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			c.w.logf("container %s did not stop", c.spec.Name)
		}
	}
}
