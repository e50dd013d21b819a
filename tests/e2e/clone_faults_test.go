package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// shortCloneTokenLifetime is the admission webhook's clone token lifetime
// in TestCloneFaults: short enough that a test outlives it.
const shortCloneTokenLifetime = 3 * time.Second

// TestCloneFaults runs the clones that must survive something going wrong,
// one after another with an admission server of their own (its clone
// tokens last shortCloneTokenLifetime) and a controller of their own,
// limited to their namespaces, that the kill subtests replace: the controller killed mid-clone for each strategy, a clone whose
// source appears after its short token expired (CDI #2777), and a clone
// into a WaitForFirstConsumer class that says what it waits for.
func TestCloneFaults(t *testing.T) {
	parallel(t)
	s := startOwnCloneStack(t, "--clone-token-lifetime="+shortCloneTokenLifetime.String())
	start := time.Now()
	t.Run("SourceAfterShortTokenExpired", func(t *testing.T) {
		// Any strategy: the token is checked before the source is read.
		s.testSourceAfterTokenExpired(t, s.cloneClass(t, classOpts{strategy: cdiv1.CloneStrategyCsiClone}))
	})
	for _, st := range strategies {
		t.Run("KillControllerMidClone/"+string(st), func(t *testing.T) { s.testKillMidClone(t, st) })
	}
	t.Run("WaitForFirstConsumer", func(t *testing.T) { s.testWaitForFirstConsumer(t) })
	t.Logf("clone fault tests took %s", time.Since(start).Round(time.Millisecond))
}

// inFlightPhase is the DataVolume phase of each strategy's slow step.
var inFlightPhase = map[cdiv1.CDICloneStrategy]cdiv1.DataVolumePhase{
	cdiv1.CloneStrategyHostAssisted: cdiv1.CloneInProgress,
	cdiv1.CloneStrategySnapshot:     cdiv1.SnapshotForSmartCloneInProgress,
	cdiv1.CloneStrategyCsiClone:     cdiv1.CSICloneInProgress,
}

// testKillMidClone stops the controller while a cross-namespace clone is in
// its strategy's slow step (a 384 MiB copy streaming; a CreateSnapshot or a
// CSI clone the driver holds for 8 s), starts a new one, and the clone
// finishes: Succeeded, the source's bytes, each temporary object made once
// and never two of a kind at a time, and once the DataVolume is deleted
// nothing is left in either namespace.
func (s *cloneStack) testKillMidClone(t *testing.T, st cdiv1.CDICloneStrategy) {
	ctx := context.Background()
	opts := classOpts{strategy: st}
	dataMiB, size := 0, "32Mi"
	switch st {
	case cdiv1.CloneStrategyHostAssisted:
		dataMiB, size = 384, "400Mi"
	case cdiv1.CloneStrategySnapshot:
		opts.snapshotClass = s.slowSnapshotClass(t, "8s")
	case cdiv1.CloneStrategyCsiClone:
		opts.delay = "8s"
	}
	class := s.cloneClass(t, opts)
	srcNs, dstNs := s.namespace(t, "clone-src"), s.namespace(t, "clone-dst")
	src := s.makeSource(t, srcNs, "golden", class, size, false, dataMiB)
	temps := trackTemporaries(t, s.c, srcNs, dstNs)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the clone when the test failed:\n%s\n%s", s.describeClone(dstNs, "survivor", srcNs, nil), s.describePods(srcNs))
		}
	})
	s.create(t, kit.DataVolume(dstNs, "survivor", pvcSource(srcNs, "golden"), kit.WithPVC(cloneSpec(class, size, false))))

	dv := &cdiv1.DataVolume{}
	target := &corev1.PersistentVolumeClaim{}
	var inFlight string
	kit.Eventually(t, cloneTimeout, 100*time.Millisecond, "the "+string(st)+" clone to be in "+string(inFlightPhase[st]), func() (bool, string, error) {
		if err := s.c.Get(ctx, types.NamespacedName{Namespace: dstNs, Name: "survivor"}, dv); err != nil {
			return false, "", err
		}
		if dv.Status.Phase == cdiv1.Succeeded {
			t.Fatalf("the clone finished before the test saw it in flight (%s)\n%s", st, s.describeClone(dstNs, "survivor", srcNs, dv))
		}
		if dv.Status.Phase != inFlightPhase[st] {
			return false, fmt.Sprintf("DataVolume %s", dv.Status.Phase), nil
		}
		if err := s.c.Get(ctx, types.NamespacedName{Namespace: dstNs, Name: "survivor"}, target); err != nil {
			return false, "", err
		}
		inFlight = s.slowStepInFlight(ctx, st, srcNs, string(target.UID))
		return inFlight != "", fmt.Sprintf("DataVolume %s %s", dv.Status.Phase, dv.Status.Progress), nil
	})
	t.Logf("killing the controller mid-clone: %s, DataVolume %s %s", inFlight, dv.Status.Phase, dv.Status.Progress)
	begin := time.Now()
	// Down long enough for the copy, the snapshot or the CSI clone to go on
	// without a controller, short enough that the new one finds it running.
	down := 3 * time.Second
	if st == cdiv1.CloneStrategyHostAssisted {
		down = time.Second
	}
	s.restartController(down)
	dv, seen := s.waitCloned(t, dstNs, "survivor", srcNs, cloneTimeout)
	t.Logf("%s clone finished %s after the controller was killed; phases since %v", st, time.Since(begin).Round(time.Millisecond), seen)
	pvc := s.assertClone(t, dv, src, cloneExpect{strategy: st})
	assertBytes(t, dstNs, src.sha, map[string]bool{"survivor": false})
	t.Logf("temporary objects: %s", temps.CheckTemporaries(t, pvc.UID))

	// The readers are done; the claim's protection waits for no pod.
	s.deletePods(t, dstNs, "read-")
	if err := s.c.Delete(ctx, dv); err != nil {
		t.Fatal(err)
	}
	s.assertNothingLeft(t, src, dstNs, pvc.UID)
	assertBytes(t, srcNs, src.sha, map[string]bool{"golden": false})
}

// testSourceAfterTokenExpired is CDI issue #2777 on the cluster: a
// cross-namespace clone created before its source, its webhook token
// lasting seconds, waits saying the source is missing; the source is
// created once that token is expired (as the controller's own check of it
// says), and the clone succeeds on the extended token the controller
// minted at once.
func (s *cloneStack) testSourceAfterTokenExpired(t *testing.T, class string) {
	ctx := context.Background()
	srcNs, dstNs := s.namespace(t, "clone-src"), s.namespace(t, "clone-dst")
	s.create(t, kit.DataVolume(dstNs, "early", pvcSource(srcNs, "later"), kit.WithPVC(cloneSpec(class, "32Mi", false))))
	dv := kit.Await(t, time.Minute, 200*time.Millisecond, "the clone to wait for its source with an extended token",
		func() (*cdiv1.DataVolume, error) {
			dv := &cdiv1.DataVolume{}
			return dv, s.c.Get(ctx, types.NamespacedName{Namespace: dstNs, Name: "early"}, dv)
		},
		func(dv *cdiv1.DataVolume) bool {
			return dv.Annotations[cdiv1.AnnExtendedCloneToken] != "" &&
				strings.Contains(kit.DataVolumeCondition(dv, cdiv1.DataVolumeRunning).Message, "doesn't exist")
		},
		func(dv *cdiv1.DataVolume) string { return s.describeClone(dstNs, "early", srcNs, dv) })
	short := dv.Annotations[cdiv1.AnnCloneToken]
	if short == "" {
		t.Fatalf("the DataVolume has no %s: the webhook did not run", cdiv1.AnnCloneToken)
	}
	s.waitEvent(t, dstNs, "early", corev1.EventTypeWarning, "CloneWithoutSource", 30*time.Second)
	// The controller's validator of webhook tokens, with its leeway.
	keys := &token.DirKeySource{Dir: s.adm.SigningKeyDir, Window: time.Hour}
	validator := token.NewMultiKeyValidator(token.CloneTokenIssuer, keys.PublicKeys, token.DefaultCloneTokenLeeway)
	if _, err := validator.Validate(short); err != nil {
		t.Logf("the short token is already refused: %v", err)
	}
	waited := kit.Eventually(t, time.Minute, 500*time.Millisecond, "the short clone token to expire", func() (bool, string, error) {
		_, err := validator.Validate(short)
		return err != nil, "still valid", nil
	})
	_, err := validator.Validate(short)
	t.Logf("short token refused %s after the wait began: %v", waited.Round(time.Millisecond), err)
	src := s.makeLateSource(t, srcNs, "later", class, "32Mi")
	dv, seen := s.waitCloned(t, dstNs, "early", srcNs, cloneTimeout)
	t.Logf("clone created before its source, source made after the short token expired: phases %v", seen)
	s.assertClone(t, dv, src, cloneExpect{strategy: cdiv1.CloneStrategyCsiClone})
	assertBytes(t, dstNs, src.sha, map[string]bool{"early": false})
	// The claim may have been seen with only the expired short token for a
	// moment: never told to re-create a clone that goes on by itself.
	events := &corev1.EventList{}
	if err := s.c.List(ctx, events, client.InNamespace(dstNs)); err != nil {
		t.Fatal(err)
	}
	for _, e := range events.Items {
		if e.InvolvedObject.Name == "early" && strings.Contains(e.Message, "create the clone again") {
			t.Errorf("a %s %s event told the user to re-create the clone: %s", e.Type, e.Reason, e.Message)
		}
	}
}

// testWaitForFirstConsumer clones into the cluster's WaitForFirstConsumer
// class with no pod using the claim: the DataVolume is PendingPopulation,
// its Running condition and an event say it waits for a first consumer and
// how to end that; a pod that uses the claim then gets the source's bytes.
func (s *cloneStack) testWaitForFirstConsumer(t *testing.T) {
	ctx := context.Background()
	srcNs, dstNs := s.namespace(t, "clone-src"), s.namespace(t, "clone-dst")
	src := s.makeSource(t, srcNs, "golden", cluster.StorageClassImmediate, "32Mi", false, 0)
	s.create(t, kit.DataVolume(dstNs, "lazy", pvcSource(srcNs, "golden"), kit.WithPVC(cloneSpec(cluster.StorageClassWFFC, "32Mi", false))))
	dv := kit.Await(t, time.Minute, 200*time.Millisecond, "the clone to say it waits for a first consumer",
		func() (*cdiv1.DataVolume, error) {
			dv := &cdiv1.DataVolume{}
			return dv, s.c.Get(ctx, types.NamespacedName{Namespace: dstNs, Name: "lazy"}, dv)
		},
		func(dv *cdiv1.DataVolume) bool {
			return dv.Status.Phase == cdiv1.PendingPopulation &&
				strings.Contains(kit.DataVolumeCondition(dv, cdiv1.DataVolumeRunning).Message, "first consumer")
		},
		func(dv *cdiv1.DataVolume) string { return s.describeClone(dstNs, "lazy", srcNs, dv) })
	running := kit.DataVolumeCondition(dv, cdiv1.DataVolumeRunning)
	t.Logf("Running: %s: %s", running.Reason, running.Message)
	ev := s.waitEvent(t, dstNs, "lazy", corev1.EventTypeNormal, string(cdiv1.PendingPopulation), 30*time.Second)
	t.Logf("event %s: %s", ev.Reason, ev.Message)
	for _, want := range []string{"first consumer", "pod"} {
		if !strings.Contains(ev.Message, want) {
			t.Errorf("the %s event %q does not say %q", ev.Reason, ev.Message, want)
		}
	}
	// Still waiting a while later: nothing starts without a consumer.
	time.Sleep(3 * time.Second)
	if err := s.c.Get(ctx, types.NamespacedName{Namespace: dstNs, Name: "lazy"}, dv); err != nil {
		t.Fatal(err)
	}
	if dv.Status.Phase != cdiv1.PendingPopulation {
		t.Errorf("with no consumer the DataVolume went on to %s", dv.Status.Phase)
	}
	sum := strings.TrimSpace(runToCompletion(t, dstNs, podWithClaim("consumer", "lazy", false,
		fmt.Sprintf("head -c %d /data/disk.img | sha256sum | cut -d' ' -f1 > /dev/termination-log", cloneDataSize))))
	if sum != src.sha {
		t.Errorf("the first consumer read sha256 %q, the source holds %s", sum, src.sha)
	}
	dv, seen := s.waitCloned(t, dstNs, "lazy", srcNs, cloneTimeout)
	t.Logf("WaitForFirstConsumer clone: phases %v", seen)
}

// describePods is one line per pod of ns: phase, readiness and the
// containers' states.
func (s *cloneStack) describePods(ns string) string {
	pods := &corev1.PodList{}
	if err := s.c.List(context.Background(), pods, client.InNamespace(ns)); err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		fmt.Fprintf(&b, "pod %s/%s %s ip %s", ns, p.Name, p.Status.Phase, p.Status.PodIP)
		for _, c := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, " [%s ready=%v restarts=%d %+v]", c.Name, c.Ready, c.RestartCount, c.State)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// deletePods deletes the pods of ns whose names start with prefix.
func (s *cloneStack) deletePods(t *testing.T, ns, prefix string) {
	t.Helper()
	pods := &corev1.PodList{}
	if err := s.c.List(context.Background(), pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for i := range pods.Items {
		if strings.HasPrefix(pods.Items[i].Name, prefix) {
			if err := s.c.Delete(context.Background(), &pods.Items[i]); client.IgnoreNotFound(err) != nil {
				t.Fatal(err)
			}
		}
	}
}

// trackTemporaries starts watching namespaces' claims, pods and snapshots
// until the test ends.
func trackTemporaries(t *testing.T, c client.Client, namespaces ...string) *kit.Tracker {
	t.Helper()
	wc, err := client.NewWithWatch(cl.Config, client.Options{Scheme: c.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return kit.Track(t, wc, nil, namespaces...)
}
