package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// oomLimit is a memory limit the worker cannot start under: the kernel
// kills the importer (OOMKilled, exit 137) before it reads a byte.
const oomLimit = "8Mi"

// TestOOMKilledWorkerIsExplained: with CDIConfig's podResourceRequirements
// limiting worker pods to less memory than the importer needs, the kernel
// kills the importer at its limit. The DataVolume says the importer ran out
// of memory, names the limit and where to raise it, counts the restart and
// raises a Warning event; once the limit is raised the next attempt imports.
func TestOOMKilledWorkerIsExplained(t *testing.T) {
	needRealNode(t)
	c := shared.c
	restore := setPodLimitsUntil(t, c, oomLimit)
	ns := newNamespace(t)
	dir := t.TempDir()
	name := rawImage(t, dir, 8<<20)
	dv := httpDV(ns, "starved", imageServer(t, dir)+"/"+name, cluster.StorageClassImmediate)
	ctx := context.Background()
	if err := c.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var explained cdiv1.DataVolumeCondition
	killed := map[string]bool{}
	got, _ := kit.WaitDataVolume(t, c, ns, dv.Name, 4*time.Minute, func(dv *cdiv1.DataVolume) bool {
		for _, k := range oomKills(t, ns) {
			killed[k] = true
		}
		if cond := runningCondition(dv); strings.Contains(cond.Message, "ran out of memory") {
			explained = cond
		}
		return kit.Terminal(dv.Status.Phase) || (explained.Message != "" && dv.Status.RestartCount > 0)
	})
	if explained.Message == "" {
		t.Fatalf("under a %s limit the DataVolume never said the importer ran out of memory: phase %s, restarts %d, conditions %+v\nkilled containers seen: %v\nevents:\n%s",
			oomLimit, got.Status.Phase, got.Status.RestartCount, got.Status.Conditions, killed, eventsFor(ns, dv.Name))
	}
	t.Logf("%s after the import began, restarts %d, Running condition %s: %s", time.Since(start).Round(time.Millisecond), got.Status.RestartCount, explained.Reason, explained.Message)
	for _, want := range []string{"the importer ran out of memory", "killed at its " + oomLimit + " memory limit", "spec.podResourceRequirements.limits.memory", "CDIConfig config"} {
		if !strings.Contains(explained.Message, want) {
			t.Errorf("the Running condition %q does not say %q", explained.Message, want)
		}
	}
	if got.Status.RestartCount < 1 {
		t.Errorf("the DataVolume counts %d restarts after an OOM kill, want at least 1", got.Status.RestartCount)
	}
	t.Logf("importer containers seen OOMKilled: %v", killed)
	if len(killed) == 0 {
		t.Errorf("no importer container was seen OOMKilled (exit 137); the message came from elsewhere")
	}
	ev := waitDVEvent(t, c, ns, dv.Name, "ran out of memory", time.Minute)
	t.Logf("event on the DataVolume: %s %s: %s", ev.Type, ev.Reason, ev.Message)
	if ev.Type != corev1.EventTypeWarning || !strings.Contains(ev.Message, "podResourceRequirements") {
		t.Errorf("the DataVolume's event is %s %q, want a Warning naming podResourceRequirements", ev.Type, ev.Message)
	}

	// The advice works: with the limit raised back, a later attempt imports.
	restore()
	raised := time.Now()
	got, _ = kit.WaitDataVolume(t, c, ns, dv.Name, 4*time.Minute, func(dv *cdiv1.DataVolume) bool { return kit.Terminal(dv.Status.Phase) })
	if got.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("after the limit was raised the DataVolume ended %s: %+v\nevents:\n%s", got.Status.Phase, got.Status.Conditions, eventsFor(ns, dv.Name))
	}
	t.Logf("imported %s after the limit was raised, %d restarts counted", time.Since(raised).Round(time.Millisecond), got.Status.RestartCount)
	assertNoLeftovers(t, c, ns)
}

// setPodLimitsUntil is setPodLimits with a restore that can be called
// early; it waits until CDIConfig's status no longer carries the limit, so a
// worker started after it gets the old resources.
func setPodLimitsUntil(t *testing.T, c client.Client, memory string) (restore func()) {
	t.Helper()
	ctx := context.Background()
	key := client.ObjectKey{Name: cdiv1.CDIConfigName}
	cfg := &cdiv1.CDIConfig{}
	kit.Eventually(t, time.Minute, kit.Interval, "CDIConfig to exist", func() (bool, string, error) {
		err := c.Get(ctx, key, cfg)
		return err == nil, fmt.Sprint(err), nil
	})
	old := cfg.Spec.PodResourceRequirements.DeepCopy()
	setPodLimits(t, c, memory)
	q := resource.MustParse(memory)
	return func() {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur := &cdiv1.CDIConfig{}
			if err := c.Get(ctx, key, cur); err != nil {
				return err
			}
			cur.Spec.PodResourceRequirements = old
			return c.Update(ctx, cur)
		})
		if err != nil {
			t.Fatalf("restore CDIConfig: %v", err)
		}
		kit.Eventually(t, time.Minute, kit.Interval, "CDIConfig status to drop the "+memory+" limit", func() (bool, string, error) {
			cur := &cdiv1.CDIConfig{}
			if err := c.Get(ctx, key, cur); err != nil {
				return false, "", err
			}
			r := cur.Status.DefaultPodResourceRequirements
			return r == nil || r.Limits.Memory().Cmp(q) != 0, fmt.Sprintf("status %+v", r), nil
		})
	}
}

// oomKills names the importer containers of ns the kernel killed for memory.
func oomKills(t *testing.T, ns string) []string {
	t.Helper()
	pods, err := cl.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: cdiv1.LabelComponent + "=importer"})
	if err != nil {
		t.Logf("listing importer pods: %v", err)
		return nil
	}
	var out []string
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			for _, term := range []*corev1.ContainerStateTerminated{cs.State.Terminated, cs.LastTerminationState.Terminated} {
				if term != nil && (term.Reason == "OOMKilled" || (term.Reason == "StartError" && strings.Contains(term.Message, "OOM-killed"))) {
					out = append(out, fmt.Sprintf("%s %s exit %d", p.Name, term.Reason, term.ExitCode))
				}
			}
		}
	}
	return out
}

// waitDVEvent waits for an event on DataVolume ns/name whose message has sub.
func waitDVEvent(t *testing.T, c client.Client, ns, name, sub string, timeout time.Duration) corev1.Event {
	t.Helper()
	var found corev1.Event
	kit.Eventually(t, timeout, kit.Interval, fmt.Sprintf("an event on DataVolume %s saying %q", name, sub), func() (bool, string, error) {
		list := &corev1.EventList{}
		if err := c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
			return false, "", err
		}
		var seen []string
		for _, e := range list.Items {
			if e.InvolvedObject.Kind != "DataVolume" || e.InvolvedObject.Name != name {
				continue
			}
			if strings.Contains(e.Message, sub) {
				found = e
				return true, "", nil
			}
			seen = append(seen, e.Reason+": "+e.Message)
		}
		return false, strings.Join(seen, "\n"), nil
	})
	return found
}
