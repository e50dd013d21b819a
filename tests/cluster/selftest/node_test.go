package selftest

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/kubefill/kubefill/tests/kit"
)

// TestPodEnvAndVolumes: env from values, secrets, configmaps and the
// downward API, and secret, configmap, downward API, emptyDir and projected
// service-account volumes, as a kubelet provides them.
func TestPodEnvAndVolumes(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	ctx := context.Background()
	if _, err := cl.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		Data:       map[string][]byte{"accessKeyId": []byte("AKID"), "secretKey": []byte("s3cr3t")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "settings"},
		Data:       map[string]string{"endpoint": "http://example.invalid/disk.img", "ca.pem": "PEM"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	script := strings.Join([]string{
		`printf '%s|%s|%s|%s|%s|' "$ACCESS" "$ENDPOINT" "$POD_NAME" "$POD_NS" "$COMBINED" > /dev/termination-log`,
		`printf '%s|%s|%s|' "$(cat /creds/secretKey)" "$(cat /etc/settings/ca.pem)" "$(cat /info/labels)" >> /dev/termination-log`,
		`echo scratch > /scratch/f && printf '%s|' "$(cat /scratch/f)" >> /dev/termination-log`,
		`test -s /var/run/secrets/kubernetes.io/serviceaccount/token && printf 'token|' >> /dev/termination-log`,
		`printf '%s' "$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace)" >> /dev/termination-log`,
	}, " && ")
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "env", Labels: map[string]string{"app": "kubefill"}},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name:    "main",
				Image:   shellImage,
				Command: []string{"sh", "-c", script},
				Env: []corev1.EnvVar{
					{Name: "ACCESS", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "accessKeyId"}}},
					{Name: "ENDPOINT", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: "endpoint"}}},
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
					{Name: "POD_NS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
					{Name: "COMBINED", Value: "$(POD_NAME)@$(POD_NS)"},
				},
				VolumeMounts: []corev1.VolumeMount{
					{Name: "creds", MountPath: "/creds", ReadOnly: true},
					{Name: "settings", MountPath: "/etc/settings"},
					{Name: "info", MountPath: "/info"},
					{Name: "scratch", MountPath: "/scratch"},
				},
			}},
			Volumes: []corev1.Volume{
				{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}},
				{Name: "settings", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}},
				{Name: "info", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
					{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels"}},
				}}}},
				{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			},
		},
	}
	msg := runToCompletion(t, ns, pod)
	want := fmt.Sprintf(`AKID|http://example.invalid/disk.img|env|%s|env@%s|s3cr3t|PEM|app="kubefill"|scratch|token|%s`, ns, ns, ns)
	if msg != want {
		t.Fatalf("termination message\n got %q\nwant %q", msg, want)
	}
}

// TestPodRestartAndExitCode: under OnFailure a failing container restarts
// (restartCount grows) and its last termination keeps the exit code and
// message; under Never a failure fails the pod with that exit code.
func TestPodRestartAndExitCode(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	// Fails on its first run, succeeds on its second: the emptyDir outlives
	// the container's restarts.
	flaky := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "flaky"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyOnFailure,
			Containers: []corev1.Container{{
				Name:         "main",
				Image:        shellImage,
				Command:      []string{"sh", "-c", `if [ -e /state/ran ]; then echo second > /dev/termination-log; exit 0; fi; touch /state/ran; echo first run failed > /dev/termination-log; exit 7`},
				VolumeMounts: []corev1.VolumeMount{{Name: "state", MountPath: "/state"}},
			}},
			Volumes: []corev1.Volume{{Name: "state", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
		},
	}
	msg := runToCompletion(t, ns, flaky)
	p, err := cl.Client.CoreV1().Pods(ns).Get(context.Background(), "flaky", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cs := p.Status.ContainerStatuses[0]
	if msg != "second\n" || cs.RestartCount != 1 {
		t.Fatalf("message %q restartCount %d; want second run's message and 1 restart", msg, cs.RestartCount)
	}
	if lt := cs.LastTerminationState.Terminated; lt == nil || lt.ExitCode != 7 || lt.Message != "first run failed\n" {
		t.Fatalf("last termination = %+v, want exit 7 with the first run's message", cs.LastTerminationState)
	}

	failing := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "failing"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "main", Image: shellImage, Command: []string{"sh", "-c", "echo broken; exit 3"},
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			}},
		},
	}
	createPod(t, ns, failing)
	done := waitPod(t, ns, "failing", time.Minute, "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	term := done.Status.ContainerStatuses[0].State.Terminated
	if term == nil || term.ExitCode != 3 || term.Reason != "Error" || !strings.Contains(term.Message, "broken") {
		t.Fatalf("terminated state = %+v, want exit 3, Error, the log as message", term)
	}
}

// TestUnknownImage: an image that was not built here cannot be pulled (every
// registry name points at a closed loopback port): the pod stays Pending,
// waiting with ErrImagePull or ImagePullBackOff.
func TestUnknownImage(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	createPod(t, ns, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "unknown"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "example.invalid/nothing:1"}}},
	})
	p := waitPod(t, ns, "unknown", 30*time.Second, "ErrImagePull", func(p *corev1.Pod) bool {
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Waiting == nil {
			return false
		}
		r := p.Status.ContainerStatuses[0].State.Waiting.Reason
		return r == "ErrImagePull" || r == "ImagePullBackOff"
	})
	if p.Status.Phase != corev1.PodPending {
		t.Fatalf("phase = %s, want Pending", p.Status.Phase)
	}
}

// serverPod serves HTTP with a readiness probe; its /ready file appears
// after a moment so that Ready turns from false to true.
func serverPod(name string) *corev1.Pod {
	script := `mkdir -p /www; echo "hello from $(hostname)" > /www/index.html; (sleep 1; touch /www/ready) & exec httpd -f -p 8080 -h /www`
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To(int64(3)),
			Containers: []corev1.Container{{
				Name:    "main",
				Image:   shellImage,
				Command: []string{"sh", "-c", script},
				Ports:   []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// TestPodNetworkAndReadiness: a pod gets a private address reachable from
// the host and from another pod, its HTTP readiness probe makes it Ready,
// an exec probe works, and deletion stops it within its grace period.
func TestPodNetworkAndReadiness(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	createPod(t, ns, serverPod("server"))
	start := time.Now()
	server := waitPod(t, ns, "server", time.Minute, "Ready", podReady)
	t.Logf("server Ready at %s after %s", server.Status.PodIP, time.Since(start).Round(time.Millisecond))

	// From the host.
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + server.Status.PodIP + ":8080/")
	if err != nil {
		t.Fatalf("GET from host: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "hello from server") {
		t.Fatalf("host got %q", body)
	}

	// From another pod, with an exec readiness probe on the client.
	client := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "client"},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name:  "main",
				Image: shellImage,
				Command: []string{"sh", "-c", fmt.Sprintf(
					`printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 %s 8080 > /dev/termination-log`, server.Status.PodIP)},
			}},
		},
	}
	if msg := runToCompletion(t, ns, client); !strings.Contains(msg, "hello from server") {
		t.Fatalf("pod-to-pod GET got %q", msg)
	}

	probed := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "probed"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			Containers: []corev1.Container{{
				Name: "main", Image: shellImage,
				Command: []string{"sh", "-c", "sleep 1; touch /tmp/ok; exec sleep 3600"},
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-e", "/tmp/ok"}}},
					PeriodSeconds: 1,
				},
			}},
		},
	}
	createPod(t, ns, probed)
	waitPod(t, ns, "probed", time.Minute, "Ready (exec probe)", podReady)

	// Deletion: the server ignores nothing, so SIGTERM stops it well within
	// its grace period, and kubelet then removes the pod object.
	start = time.Now()
	if err := cl.Client.CoreV1().Pods(ns).Delete(context.Background(), "server", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	kit.Eventually(t, 30*time.Second, pollInterval, "the deleted pod to go away", func() (bool, string, error) {
		p, err := cl.Client.CoreV1().Pods(ns).Get(context.Background(), "server", metav1.GetOptions{})
		if err != nil {
			return true, "", nil
		}
		return false, fmt.Sprintf("pod still there: %s, deleting=%v", p.Status.Phase, p.DeletionTimestamp != nil), nil
	})
	t.Logf("pod deleted in %s", time.Since(start).Round(time.Millisecond))
	if _, err := (&http.Client{Timeout: time.Second}).Get("http://" + server.Status.PodIP + ":8080/"); err == nil {
		t.Fatal("the deleted pod's address still answers")
	}
}

// TestLivenessProbeRestarts: a container whose liveness probe fails is
// killed and restarted, and the pod's status shows the restart and how the
// killed run ended.
func TestLivenessProbeRestarts(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	createPod(t, ns, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "liveness"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To(int64(1)),
			Containers: []corev1.Container{{
				Name: "main", Image: shellImage,
				// Healthy for a moment, then not; every run starts afresh. As
				// PID 1 the shell must handle SIGTERM itself to end with 143.
				Command: []string{"sh", "-c", "trap 'exit 143' TERM; touch /tmp/alive; sleep 2; rm /tmp/alive; sleep 3600 & wait"},
				LivenessProbe: &corev1.Probe{
					ProbeHandler:     corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"test", "-e", "/tmp/alive"}}},
					PeriodSeconds:    1,
					FailureThreshold: 2,
				},
			}},
		},
	})
	p := waitPod(t, ns, "liveness", time.Minute, "restarted by its liveness probe", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].RestartCount >= 1
	})
	last := p.Status.ContainerStatuses[0].LastTerminationState.Terminated
	if last == nil || last.ExitCode != 143 {
		t.Fatalf("last termination = %+v, want SIGTERM's exit code 143", p.Status.ContainerStatuses[0].LastTerminationState)
	}
	if ev := eventsFor(ns, "liveness"); !strings.Contains(ev, "Liveness probe failed") {
		t.Fatalf("no Unhealthy event for the liveness probe:\n%s", ev)
	}
}

// TestSecurityContext: runAsUser, runAsGroup and fsGroup as a kubelet
// applies them: the process's ids, and a PVC and an emptyDir writable
// through the fsGroup; runAsNonRoot without a user is refused.
func TestSecurityContext(t *testing.T) {
	t.Parallel()
	ns := newNamespace(t)
	createPVC(t, ns, pvcSpec("owned", "kubefill-hostpath", "16Mi", corev1.PersistentVolumeFilesystem))
	waitPVCPhase(t, ns, "owned", corev1.ClaimBound, time.Minute)
	pod := podWithClaim("ids", "owned", false,
		`mkdir /data/sub && echo x > /data/sub/f && echo y > /scratch/f && printf '%s %s %s %s' "$(id -u)" "$(id -g)" "$(id -G)" "$(stat -c %g /data/sub/f)" > /dev/termination-log`)
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To(int64(107)), RunAsGroup: ptr.To(int64(108)), FSGroup: ptr.To(int64(2000))}
	pod.Spec.Containers[0].VolumeMounts = append(pod.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "scratch", MountPath: "/scratch"})
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	if msg := runToCompletion(t, ns, pod); msg != "107 108 108 2000 2000" {
		t.Fatalf("ids and new file's group = %q, want %q", msg, "107 108 108 2000 2000")
	}

	root := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "nonroot"},
		Spec: corev1.PodSpec{
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true)},
			Containers:      []corev1.Container{{Name: "main", Image: shellImage, Command: []string{"true"}}},
		},
	}
	createPod(t, ns, root)
	waitPod(t, ns, "nonroot", 30*time.Second, "CreateContainerConfigError", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
			p.Status.ContainerStatuses[0].State.Waiting.Reason == "CreateContainerConfigError"
	})
}
