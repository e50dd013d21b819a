package kit

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// ObjectEvent is one sighting of a claim, pod or VolumeSnapshot by a
// Tracker's watch: it appeared or changed, or (Gone) it was deleted.
type ObjectEvent struct {
	Kind, Namespace, Name string
	UID                   types.UID
	Gone                  bool
}

// Tracker records every claim, pod and VolumeSnapshot appearing and going
// in some namespaces, from watches, so that a test can count a flow's
// temporary objects over its whole life (a restarted controller must not
// make one twice). OnDataVolume, when set before Track starts it, also
// sees every DataVolume event (under the tracker's lock).
type Tracker struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	events []ObjectEvent
}

// Track watches namespaces until the test ends. onDataVolume, if not nil,
// is called for every DataVolume event in them.
func Track(t testing.TB, c client.WithWatch, onDataVolume func(watch.EventType, *cdiv1.DataVolume), namespaces ...string) *Tracker {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tr := &Tracker{cancel: cancel}
	t.Cleanup(tr.Stop)
	kinds := map[string]func() client.ObjectList{
		"claim":    func() client.ObjectList { return &corev1.PersistentVolumeClaimList{} },
		"pod":      func() client.ObjectList { return &corev1.PodList{} },
		"snapshot": func() client.ObjectList { return &snapshotv1.VolumeSnapshotList{} },
	}
	if onDataVolume != nil {
		kinds["datavolume"] = func() client.ObjectList { return &cdiv1.DataVolumeList{} }
	}
	for _, ns := range namespaces {
		for kind, list := range kinds {
			w, err := c.Watch(ctx, list(), client.InNamespace(ns))
			if err != nil {
				cancel()
				t.Fatalf("watching %ss in %s: %v", kind, ns, err)
			}
			tr.wg.Add(1)
			go tr.follow(ctx, c, w, kind, ns, list, onDataVolume)
		}
	}
	return tr
}

// follow records one watch's events, watching again when the server ends it.
func (tr *Tracker) follow(ctx context.Context, c client.WithWatch, w watch.Interface, kind, ns string, list func() client.ObjectList, onDataVolume func(watch.EventType, *cdiv1.DataVolume)) {
	defer tr.wg.Done()
	for {
		for ev := range w.ResultChan() {
			obj, ok := ev.Object.(client.Object)
			if !ok || ev.Type == watch.Bookmark || ev.Type == watch.Error {
				continue
			}
			tr.mu.Lock()
			if dv, ok := obj.(*cdiv1.DataVolume); ok {
				onDataVolume(ev.Type, dv)
			} else {
				tr.events = append(tr.events, ObjectEvent{Kind: kind, Namespace: ns, Name: obj.GetName(), UID: obj.GetUID(), Gone: ev.Type == watch.Deleted})
			}
			tr.mu.Unlock()
		}
		if ctx.Err() != nil {
			return
		}
		var err error
		if w, err = c.Watch(ctx, list(), client.InNamespace(ns)); err != nil {
			return
		}
	}
}

// Stop ends the watches; Track registers it as a test cleanup too.
func (tr *Tracker) Stop() {
	tr.cancel()
	tr.wg.Wait()
}

// Events is a copy of what was seen so far.
func (tr *Tracker) Events() []ObjectEvent {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]ObjectEvent(nil), tr.events...)
}

// Temporary is what was seen of one role of temporary object: a kind and a
// name with the owner's UID replaced by <uid>.
type Temporary struct {
	Role string
	// Made counts distinct UIDs; MostAtOnce the most that existed together.
	Made, MostAtOnce int
}

// Temporaries replays events for the objects named after uid (prime-<uid>,
// importer-prime-<uid>, tmp-pvc-<uid>, tmp-snapshot-<uid>,
// <uid>-source-pod, …), by role, sorted. It is pure.
func Temporaries(events []ObjectEvent, uid types.UID) []Temporary {
	live := map[string]map[types.UID]bool{}
	made := map[string]map[types.UID]bool{}
	most := map[string]int{}
	for _, ev := range events {
		if !strings.Contains(ev.Name, string(uid)) {
			continue
		}
		role := ev.Kind + " " + strings.ReplaceAll(ev.Name, string(uid), "<uid>")
		if live[role] == nil {
			live[role], made[role] = map[types.UID]bool{}, map[types.UID]bool{}
		}
		if ev.Gone {
			delete(live[role], ev.UID)
			continue
		}
		live[role][ev.UID], made[role][ev.UID] = true, true
		most[role] = max(most[role], len(live[role]))
	}
	out := make([]Temporary, 0, len(made))
	for role := range made {
		out = append(out, Temporary{Role: role, Made: len(made[role]), MostAtOnce: most[role]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Role < out[j].Role })
	return out
}

// CheckTemporaries fails the test unless every temporary object of uid was
// made once and never two of a role existed at once, and unless some were
// seen at all; it returns the summary.
func (tr *Tracker) CheckTemporaries(t testing.TB, uid types.UID) string {
	t.Helper()
	temps := Temporaries(tr.Events(), uid)
	if len(temps) == 0 {
		t.Errorf("no temporary object of claim %s was seen: the tracker saw nothing", uid)
	}
	summary := make([]string, 0, len(temps))
	for _, tmp := range temps {
		summary = append(summary, fmt.Sprintf("%s: made %d, at most %d at once", tmp.Role, tmp.Made, tmp.MostAtOnce))
		if tmp.MostAtOnce > 1 {
			t.Errorf("%d %ss existed at once", tmp.MostAtOnce, tmp.Role)
		}
		if tmp.Made > 1 {
			t.Errorf("%s was made %d times: the restarted controller redid work", tmp.Role, tmp.Made)
		}
	}
	return strings.Join(summary, "; ")
}

// OnlyProvisionerFinalizers: every finalizer left is external-provisioner's
// (its source protection holds a deleted snapshot or cloned claim until its
// next resync), and there is one.
func OnlyProvisionerFinalizers(finalizers []string) bool {
	return len(finalizers) > 0 && !slices.ContainsFunc(finalizers, func(f string) bool {
		return !strings.HasPrefix(f, "provisioner.storage.kubernetes.io/")
	})
}

// CloneStepInFlight says which slow step of a clone by st is under way in
// the source namespace (the source pod streaming, the temporary snapshot
// being taken, the CSI clone being provisioned), or "" when none is.
func CloneStepInFlight(ctx context.Context, c client.Reader, st cdiv1.CDICloneStrategy, srcNs, uid string) string {
	switch st {
	case cdiv1.CloneStrategyHostAssisted:
		pod := &corev1.Pod{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: srcNs, Name: uid + "-source-pod"}, pod); err == nil && pod.Status.Phase == corev1.PodRunning {
			return "source pod " + pod.Name + " streaming"
		}
	case cdiv1.CloneStrategySnapshot:
		sn := &snapshotv1.VolumeSnapshot{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: srcNs, Name: "tmp-snapshot-" + uid}, sn); err == nil && (sn.Status == nil || sn.Status.ReadyToUse == nil || !*sn.Status.ReadyToUse) {
			return "snapshot " + sn.Name + " being taken"
		}
	case cdiv1.CloneStrategyCsiClone:
		p := &corev1.PersistentVolumeClaim{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: srcNs, Name: "tmp-pvc-" + uid}, p); err == nil && p.Status.Phase == corev1.ClaimPending {
			return "CSI clone " + p.Name + " being provisioned"
		}
	}
	return ""
}
