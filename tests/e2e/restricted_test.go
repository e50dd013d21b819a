package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/tests/kit"
)

// podSecurityEnforce is the namespace label kube-apiserver's Pod Security
// admission enforces.
const podSecurityEnforce = "pod-security.kubernetes.io/enforce"

// restricted makes a test pod satisfy the restricted Pod Security Standard:
// non-root (the workers' uid, which owns what they write), no privilege
// escalation, every capability dropped, the runtime's default seccomp profile.
func restricted(pod *corev1.Pod) *corev1.Pod {
	uid := int64(contract.WorkerUID)
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{
		RunAsNonRoot: ptr.To(true), RunAsUser: &uid, RunAsGroup: &uid, FSGroup: &uid,
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	for i := range pod.Spec.Containers {
		pod.Spec.Containers[i].SecurityContext = &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		}
	}
	return pod
}

// restrictedSHA256 reads the first n bytes of a Filesystem claim's disk.img
// through a restricted pod and returns their sha256.
func restrictedSHA256(t *testing.T, ns, claim string, n int64) string {
	t.Helper()
	pod := restricted(podWithClaim("read-"+claim, claim, false, fmt.Sprintf("head -c %d /data/disk.img | sha256sum | cut -d' ' -f1 > /dev/termination-log", n)))
	return strings.TrimSpace(runToCompletion(t, ns, pod))
}

// assertWorkerLabel checks that a worker pod carries
// np.kubevirt.io/allow-access-cluster-services=true, as CDI's do.
func assertWorkerLabel(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if got := pod.Labels[cdiv1.LabelAllowAccessClusterServices]; got != "true" {
		t.Errorf("worker pod %s/%s has %s=%q, want \"true\"", pod.Namespace, pod.Name, cdiv1.LabelAllowAccessClusterServices, got)
	}
}

// TestRestrictedNamespace: in namespaces labelled
// pod-security.kubernetes.io/enforce=restricted, with kube-apiserver's own
// Pod Security admission enforcing (it refuses a pod that runs as root), an
// import, an upload and a host-assisted clone (its source pod in a
// restricted source namespace, its upload pod in the target) all succeed
// with the right bytes: every worker pod satisfies the restricted standard.
func TestRestrictedNamespace(t *testing.T) {
	parallel(t)
	s := shared
	ctx := context.Background()
	restrictedLabels := map[string]string{s.adm.NamespaceLabel: "true", podSecurityEnforce: "restricted"}
	ns := createNamespace(t, "restricted-", restrictedLabels)

	// The control: admission refuses a pod that does not satisfy the standard.
	_, err := cl.Client.CoreV1().Pods(ns).Create(ctx, podWithClaim("unrestricted", "none", false, "true"), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "restricted") {
		t.Fatalf("a pod without a restricted security context in %s: got %v, want Pod Security admission's refusal", ns, err)
	}

	dir := t.TempDir()
	name, virtualSize, want := testImage(t, dir)
	url := imageServer(t, dir) + "/" + name

	t.Run("import", func(t *testing.T) {
		labelled := watchWorkerPods(t, ns)
		s.create(t, kit.DataVolume(ns, "imported", kit.HTTP(url), kit.WithPVC(filesystemClaim("128Mi"))))
		dv, seen := kit.WaitDataVolumeTerminal(t, s.c, ns, "imported", 4*time.Minute)
		if dv.Status.Phase != cdiv1.Succeeded {
			t.Fatalf("import DataVolume ended %s (phases %v): %+v\nevents:\n%s", dv.Status.Phase, seen, dv.Status.Conditions, eventsFor(ns, "imported"))
		}
		if n := labelled(); n < 1 {
			t.Errorf("saw %d importer pods in %s", n, ns)
		}
		if got := restrictedSHA256(t, ns, "imported", virtualSize); got != want {
			t.Errorf("imported claim holds sha256 %s, qemu-img convert gives %s", got, want)
		}
	})

	t.Run("upload", func(t *testing.T) {
		labelled := watchWorkerPods(t, ns)
		s.create(t, kit.DataVolume(ns, "uploaded", kit.Upload(), kit.WithPVC(filesystemClaim("128Mi"))))
		base, hc, _ := uploadTarget(t, s.c, s.installNS, ns, "uploaded")
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		st, _ := f.Stat()
		mustUpload(t, hc, base+"/v1beta1/upload", f, st.Size())
		dv, seen := kit.WaitDataVolumeTerminal(t, s.c, ns, "uploaded", 3*time.Minute)
		if dv.Status.Phase != cdiv1.Succeeded {
			t.Fatalf("upload DataVolume ended %s (phases %v): %+v\nevents:\n%s", dv.Status.Phase, seen, dv.Status.Conditions, eventsFor(ns, "uploaded"))
		}
		if n := labelled(); n < 1 {
			t.Errorf("saw %d upload pods in %s", n, ns)
		}
		if got := restrictedSHA256(t, ns, "uploaded", virtualSize); got != want {
			t.Errorf("uploaded claim holds sha256 %s, qemu-img convert gives %s", got, want)
		}
	})

	t.Run("clone", func(t *testing.T) {
		class := s.cloneClass(t, classOpts{strategy: cdiv1.CloneStrategyHostAssisted})
		// The source is written by an ordinary test pod, then its namespace
		// is restricted too: the clone's source pod runs there.
		srcNs := s.namespace(t, "restricted-src")
		src := s.makeSource(t, srcNs, "golden", class, "32Mi", false, 0)
		nsObj, err := cl.Client.CoreV1().Namespaces().Get(ctx, srcNs, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nsObj.Labels[podSecurityEnforce] = "restricted"
		if _, err := cl.Client.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("restricting %s: %v", srcNs, err)
		}
		labelledSrc, labelledDst := watchWorkerPods(t, srcNs), watchWorkerPods(t, ns)
		s.create(t, kit.DataVolume(ns, "cloned", pvcSource(srcNs, "golden"), kit.WithPVC(cloneSpec(class, "32Mi", false))))
		dv, seen := s.waitCloned(t, ns, "cloned", srcNs, cloneTimeout)
		t.Logf("restricted host-assisted clone: phases %v", seen)
		s.assertClone(t, dv, src, cloneExpect{strategy: cdiv1.CloneStrategyHostAssisted})
		// The source pod, and the upload pod filling the prime (which a
		// cross-namespace clone keeps in the source namespace).
		if n := labelledSrc() + labelledDst(); n < 2 {
			t.Errorf("saw %d clone worker pods in %s and %s, want the source pod and the upload pod", n, srcNs, ns)
		}
		if got := restrictedSHA256(t, ns, "cloned", cloneDataSize); got != src.sha {
			t.Errorf("cloned claim holds sha256 %s over its first %d bytes, the source %s", got, cloneDataSize, src.sha)
		}
	})
}

// watchWorkerPods records the worker pods (app=containerized-data-importer)
// created in ns from now on, checking each carries the cluster-services
// label; the returned func stops watching and says how many were seen.
func watchWorkerPods(t *testing.T, ns string) func() int {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := cl.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: cdiv1.LabelApp + "=" + cdiv1.LabelAppValue})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	seen := make(chan map[types.UID]bool, 1)
	go func() {
		uids := map[types.UID]bool{}
		for ev := range w.ResultChan() {
			if pod, ok := ev.Object.(*corev1.Pod); ok && !uids[pod.UID] {
				uids[pod.UID] = true
				assertWorkerLabel(t, pod)
			}
		}
		seen <- uids
	}()
	stopped := false
	stop := func() map[types.UID]bool {
		if stopped {
			return nil
		}
		stopped = true
		cancel()
		w.Stop()
		return <-seen
	}
	t.Cleanup(func() { stop() })
	return func() int { return len(stop()) }
}
