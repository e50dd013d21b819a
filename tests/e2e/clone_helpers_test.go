package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/csi/hostpath"
	"github.com/kubefill/kubefill/tests/kit"
)

// cloneStack is what a clone needs: Kubefill's controller in this process
// and `kubefill apiserver` with its admission webhooks (the mutating one
// authorises the clone for the requesting user and adds the clone token)
// for the namespaces the stack makes, and a client that also knows the
// snapshot API. Most tests use the shared one; a test that restarts its
// controller starts one of its own (startOwnCloneStack).
type cloneStack struct {
	c         client.Client
	adm       *cluster.Admission
	installNS string
	// svc are the shared stack's upload services (nil in an own stack).
	svc *cluster.UploadServices
	// own hands out an own stack's namespaces (nil in the shared one).
	own *ownNames
	// stopController ends an own stack's controller manager (see restartController).
	stopController func()
	// t is the test an own stack was started for: a restarted controller
	// lives as long as it, not only as long as the subtest that restarted it.
	t *testing.T
}

func randomSuffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// namespace creates a namespace the webhooks see, deleted after the test:
// named from prefix, or the next of an own stack's namespaces.
func (s *cloneStack) namespace(t *testing.T, prefix string) string {
	t.Helper()
	labels := map[string]string{s.adm.NamespaceLabel: "true"}
	if s.own != nil {
		return createOwnNamespace(t, s.own.take(t), labels)
	}
	return createNamespace(t, prefix+"-", labels)
}

// classOpts are what a test StorageClass differs in.
type classOpts struct {
	// strategy is forced through the StorageProfile's spec.cloneStrategy.
	strategy cdiv1.CDICloneStrategy
	// snapshotClass is forced through the StorageProfile's spec.snapshotClass.
	snapshotClass string
	// delay slows the driver's CreateVolume of clones and restores of the class.
	delay string
	// noExpansion leaves allowVolumeExpansion false.
	noExpansion bool
}

// cloneClass creates an Immediate StorageClass of the test driver whose
// StorageProfile forces a clone strategy, and waits until the profile's
// status says so. It is removed after the test.
func (s *cloneStack) cloneClass(t *testing.T, o classOpts) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("clone-%s-%s", o.strategy, randomSuffix())
	immediate, del := storagev1.VolumeBindingImmediate, corev1.PersistentVolumeReclaimDelete
	sc := &storagev1.StorageClass{
		ObjectMeta:  metav1.ObjectMeta{Name: name},
		Provisioner: cluster.DriverName, ReclaimPolicy: &del, VolumeBindingMode: &immediate,
		AllowVolumeExpansion: ptr.To(!o.noExpansion),
	}
	if o.delay != "" {
		sc.Parameters = map[string]string{hostpath.DelayParameter: o.delay}
	}
	if err := s.c.Create(ctx, sc); err != nil {
		t.Fatalf("create StorageClass %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = s.c.Delete(context.Background(), sc)
		_ = s.c.Delete(context.Background(), &cdiv1.StorageProfile{ObjectMeta: metav1.ObjectMeta{Name: name}})
	})
	kit.Eventually(t, time.Minute, 200*time.Millisecond, "StorageProfile "+name+" to force clone strategy "+string(o.strategy), func() (bool, string, error) {
		p := &cdiv1.StorageProfile{}
		if err := s.c.Get(ctx, types.NamespacedName{Name: name}, p); err != nil {
			return false, "", err
		}
		if ptr.Deref(p.Spec.CloneStrategy, "") != o.strategy || (o.snapshotClass != "" && ptr.Deref(p.Spec.SnapshotClass, "") != o.snapshotClass) {
			p.Spec.CloneStrategy = ptr.To(o.strategy)
			if o.snapshotClass != "" {
				p.Spec.SnapshotClass = ptr.To(o.snapshotClass)
			}
			return false, "spec being set", s.c.Update(ctx, p)
		}
		done := ptr.Deref(p.Status.CloneStrategy, "") == o.strategy && (o.snapshotClass == "" || ptr.Deref(p.Status.SnapshotClass, "") == o.snapshotClass)
		return done, fmt.Sprintf("status %+v", p.Status), nil
	})
	return name
}

// cloneDataSize is how many bytes a test source holds (its disk.img, or
// the start of its device) and how many a clone's check reads.
const cloneDataSize = 24 << 20

// source is a claim written with recognisable data.
type source struct {
	ns, name string
	block    bool
	// sha is the sha256 of its first cloneDataSize bytes (disk.img or device).
	sha string
	// volume is the PV it is bound to.
	volume string
	uid    types.UID
}

// makeSource creates a ReadWriteOnce claim of class, size and mode, and a
// pod writes 1 MiB random blocks into it at four offsets within
// cloneDataSize bytes: a sparse disk.img of that size (Filesystem) or the
// device's first bytes (Block). dataMiB > 0 writes that many MiB of random
// data instead (a source whose copy takes a while).
func (s *cloneStack) makeSource(t *testing.T, ns, name, class, size string, block bool, dataMiB int) source {
	t.Helper()
	return s.makeSourceInOrder(t, ns, name, class, size, block, dataMiB, false)
}

// makeLateSource is makeSource for a clone that already waits for the claim:
// its writer pod is made before the claim, so the clone, which waits while a
// pod may write to its source, cannot take the claim between its binding
// and the writer's start, when it is still empty.
func (s *cloneStack) makeLateSource(t *testing.T, ns, name, class, size string) source {
	t.Helper()
	return s.makeSourceInOrder(t, ns, name, class, size, false, 0, true)
}

func (s *cloneStack) makeSourceInOrder(t *testing.T, ns, name, class, size string, block bool, dataMiB int, writerFirst bool) source {
	t.Helper()
	mode := corev1.PersistentVolumeFilesystem
	if block {
		mode = corev1.PersistentVolumeBlock
	}
	writer := sourceWriter(name, block, dataMiB)
	if writerFirst {
		kit.CreatePod(t, cl.Client, ns, writer)
	}
	createPVC(t, ns, pvcSpec(name, class, size, mode))
	pvc := waitPVCPhase(t, ns, name, corev1.ClaimBound, time.Minute)
	if !writerFirst {
		kit.CreatePod(t, cl.Client, ns, writer)
	}
	sha := strings.TrimSpace(kit.AwaitCompletion(t, cl.Client, ns, writer.Name))
	if len(sha) != 64 {
		t.Fatalf("writer of %s/%s reported %q", ns, name, sha)
	}
	return source{ns: ns, name: name, block: block, sha: sha, volume: pvc.Spec.VolumeName, uid: pvc.UID}
}

// sourceWriter is the pod that fills a source claim and reports the sha256
// of its first cloneDataSize bytes.
func sourceWriter(name string, block bool, dataMiB int) *corev1.Pod {
	target, bytes := "/data/disk.img", cloneDataSize
	if dataMiB > 0 {
		bytes = dataMiB << 20
	}
	if block {
		target = "/dev/xvda"
	}
	var script strings.Builder
	if !block {
		fmt.Fprintf(&script, "truncate -s %d %s && ", bytes, target)
	}
	if dataMiB > 0 {
		fmt.Fprintf(&script, "dd if=/dev/urandom of=%s bs=1M count=%d iflag=fullblock conv=notrunc 2>/dev/null && ", target, dataMiB)
	} else {
		for _, mib := range []int{0, 5, 13, 23} {
			fmt.Fprintf(&script, "dd if=/dev/urandom of=%s bs=1M seek=%d count=1 iflag=fullblock conv=notrunc 2>/dev/null && ", target, mib)
		}
	}
	// The checks read cloneDataSize bytes; the writer hashes as many.
	fmt.Fprintf(&script, "sync && head -c %d %s | sha256sum | cut -d' ' -f1 > /dev/termination-log", cloneDataSize, target)
	return podWithClaim("write-"+name, name, block, script.String())
}

// readClaims mounts claims (all in ns, read-only) in one pod and returns the
// sha256 of the first n bytes of each one's disk.img or device.
func readClaims(t *testing.T, ns string, n int64, claims map[string]bool) map[string]string {
	t.Helper()
	names := make([]string, 0, len(claims))
	for c := range claims {
		names = append(names, c)
	}
	sort.Strings(names)
	ctr := corev1.Container{Name: "main", Image: shellImage}
	var script strings.Builder
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "read-" + randomSuffix()},
		Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr.To(int64(2))},
	}
	for i, name := range names {
		vol := fmt.Sprintf("v%d", i)
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: vol, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name, ReadOnly: true},
		}})
		path := fmt.Sprintf("/claims/%d/disk.img", i)
		if claims[name] {
			path = fmt.Sprintf("/dev/claim%d", i)
			ctr.VolumeDevices = append(ctr.VolumeDevices, corev1.VolumeDevice{Name: vol, DevicePath: path})
		} else {
			ctr.VolumeMounts = append(ctr.VolumeMounts, corev1.VolumeMount{Name: vol, MountPath: fmt.Sprintf("/claims/%d", i), ReadOnly: true})
		}
		fmt.Fprintf(&script, "echo %s $(head -c %d %s | sha256sum | cut -d' ' -f1) >> /dev/termination-log; ", name, n, path)
	}
	ctr.Command = []string{"sh", "-c", script.String()}
	pod.Spec.Containers = []corev1.Container{ctr}
	out := runToCompletion(t, ns, pod)
	got := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			got[f[0]] = f[1]
		}
	}
	return got
}

// cloneSpec is a ReadWriteOnce claim spec for a clone's DataVolume.
func cloneSpec(class, size string, block bool) *corev1.PersistentVolumeClaimSpec {
	mode := corev1.PersistentVolumeFilesystem
	if block {
		mode = corev1.PersistentVolumeBlock
	}
	return kit.ClaimSpec(size, kit.Class(class), kit.Mode(mode))
}

// pvcSource is a DataVolume source cloning claim ns/name.
func pvcSource(ns, name string) *cdiv1.DataVolumeSource {
	return &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: name}}
}

func (s *cloneStack) create(t *testing.T, obj client.Object) {
	t.Helper()
	if err := s.c.Create(context.Background(), obj); err != nil {
		t.Fatalf("create %T %s/%s: %v", obj, obj.GetNamespace(), obj.GetName(), err)
	}
}

// waitCloned waits until a clone DataVolume is Succeeded and returns it and
// the phases it passed through. On timeout the failure names the target
// claim's clone annotations and the events of both namespaces.
func (s *cloneStack) waitCloned(t *testing.T, ns, name, srcNs string, timeout time.Duration) (*cdiv1.DataVolume, []string) {
	t.Helper()
	var seen []string
	dv := kit.Await(t, timeout, kit.DataVolumeInterval, fmt.Sprintf("clone DataVolume %s/%s to succeed", ns, name),
		func() (*cdiv1.DataVolume, error) {
			dv := &cdiv1.DataVolume{}
			if err := s.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, dv); err != nil {
				return nil, err
			}
			step := fmt.Sprintf("%s %s", dv.Status.Phase, dv.Status.Progress)
			if len(seen) == 0 || seen[len(seen)-1] != step {
				seen = append(seen, step)
			}
			return dv, nil
		},
		func(dv *cdiv1.DataVolume) bool { return dv.Status.Phase == cdiv1.Succeeded },
		func(dv *cdiv1.DataVolume) string {
			return fmt.Sprintf("passed through %v\n%s", seen, s.describeClone(ns, name, srcNs, dv))
		})
	return dv, seen
}

// describeClone is what a failed clone assertion shows: the DataVolume's
// status, the target claim's clone annotations, and both namespaces' events.
func (s *cloneStack) describeClone(ns, name, srcNs string, dv *cdiv1.DataVolume) string {
	var b strings.Builder
	if dv != nil {
		fmt.Fprintf(&b, "DataVolume status: %+v\n", dv.Status)
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := s.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, pvc); err == nil {
		fmt.Fprintf(&b, "claim %s phase=%s volume=%q finalizers=%v\n", name, pvc.Status.Phase, pvc.Spec.VolumeName, pvc.Finalizers)
		for k, v := range pvc.Annotations {
			if strings.Contains(strings.ToLower(k), "clone") || strings.Contains(k, "populator") || strings.Contains(k, "condition") {
				if strings.Contains(k, "token") {
					v = "(token)"
				}
				fmt.Fprintf(&b, "  %s=%s\n", k, v)
			}
		}
	} else {
		fmt.Fprintf(&b, "claim %s: %v\n", name, err)
	}
	for _, n := range uniq(ns, srcNs) {
		list := &corev1.EventList{}
		if err := s.c.List(context.Background(), list, client.InNamespace(n)); err == nil {
			fmt.Fprintf(&b, "events in %s:\n%s", n, kit.FormatEvents(list.Items))
		}
	}
	return b.String()
}

func uniq(a, b string) []string {
	if a == b || b == "" {
		return []string{a}
	}
	return []string{a, b}
}

// cloneExpect is what a finished clone must show.
type cloneExpect struct {
	strategy cdiv1.CDICloneStrategy
	// fallbackReason is the Warning event reason of a fallback to copy, and
	// fallbackMessage the text cdi.kubevirt.io/cloneFallbackReason holds;
	// both empty: no fallback.
	fallbackReason, fallbackMessage string
}

// assertClone checks a Succeeded clone: cloneType on the DataVolume and the
// claim, the fallback reason (or none) in the annotation and as a Warning
// event, a claim Bound to a PV of its own (not the source's) whose claimRef
// is this claim, and, eventually, the populator's finalizer and every
// temporary object gone from both namespaces.
func (s *cloneStack) assertClone(t *testing.T, dv *cdiv1.DataVolume, src source, want cloneExpect) *corev1.PersistentVolumeClaim {
	t.Helper()
	ctx := context.Background()
	ns, name := dv.Namespace, dv.Name
	if got := dv.Annotations[cdiv1.AnnCloneType]; got != string(want.strategy) {
		t.Errorf("DataVolume %s/%s has %s=%q, want %q", ns, name, cdiv1.AnnCloneType, got, want.strategy)
	}
	if want.strategy == cdiv1.CloneStrategyHostAssisted && dv.Status.Progress != "100.0%" {
		t.Errorf("host-assisted clone %s/%s ended with progress %q, want 100.0%%", ns, name, dv.Status.Progress)
	}
	pvc := &corev1.PersistentVolumeClaim{}
	if err := s.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, pvc); err != nil {
		t.Fatal(err)
	}
	if got := pvc.Annotations[cdiv1.AnnCloneType]; got != string(want.strategy) {
		t.Errorf("claim %s/%s has %s=%q, want %q", ns, name, cdiv1.AnnCloneType, got, want.strategy)
	}
	reason, hasReason := pvc.Annotations[cdiv1.AnnCloneFallbackReason]
	switch {
	case want.fallbackMessage == "" && hasReason:
		t.Errorf("claim %s/%s fell back: %s=%q", ns, name, cdiv1.AnnCloneFallbackReason, reason)
	case want.fallbackMessage != "" && !strings.Contains(reason, want.fallbackMessage):
		t.Errorf("claim %s/%s has %s=%q, want it to say %q", ns, name, cdiv1.AnnCloneFallbackReason, reason, want.fallbackMessage)
	}
	if want.fallbackReason != "" {
		s.waitEvent(t, ns, name, corev1.EventTypeWarning, want.fallbackReason, 30*time.Second)
	}
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
		t.Fatalf("claim %s/%s is %s (volume %q) after the clone succeeded", ns, name, pvc.Status.Phase, pvc.Spec.VolumeName)
	}
	if pvc.Spec.VolumeName == src.volume {
		t.Fatalf("claim %s/%s is bound to the source's own volume %s", ns, name, src.volume)
	}
	pv := &corev1.PersistentVolume{}
	if err := s.c.Get(ctx, types.NamespacedName{Name: pvc.Spec.VolumeName}, pv); err != nil {
		t.Fatal(err)
	}
	if ref := pv.Spec.ClaimRef; ref == nil || ref.UID != pvc.UID || ref.Namespace != ns || ref.Name != name {
		t.Errorf("PV %s's claimRef %+v is not claim %s/%s (%s)", pv.Name, pv.Spec.ClaimRef, ns, name, pvc.UID)
	}
	s.assertNoCloneLeftovers(t, pvc.UID, dv.UID, ns, src.ns)
	return pvc
}

// assertNoCloneLeftovers waits until nothing of the clone for claim uid
// (whose DataVolume has dvUID) is left: no object labelled
// cdi.kubevirt.io/OwnedByUID=<uid> (claims, pods, snapshots) in either
// namespace, no tmp-pvc-/tmp-snapshot- objects or <uid>-source-pod, no
// VolumeCloneSource volume-clone-source-<dvUID> in another namespace (in
// the same one it must be the DataVolume's, for the garbage collector), and
// no populator finalizer on the target claim (if it still exists).
func (s *cloneStack) assertNoCloneLeftovers(t *testing.T, uid, dvUID types.UID, ns, srcNs string) {
	t.Helper()
	ctx := context.Background()
	heldSnapshots := map[string]bool{}
	kit.Eventually(t, 30*time.Second, 250*time.Millisecond, "the clone's temporary objects to go", func() (bool, string, error) {
		var left []string
		for _, n := range uniq(ns, srcNs) {
			claims := &corev1.PersistentVolumeClaimList{}
			pods := &corev1.PodList{}
			snaps := &snapshotv1.VolumeSnapshotList{}
			if err := s.c.List(ctx, claims, client.InNamespace(n)); err != nil {
				return false, "", err
			}
			if err := s.c.List(ctx, pods, client.InNamespace(n)); err != nil {
				return false, "", err
			}
			if err := s.c.List(ctx, snaps, client.InNamespace(n)); err != nil {
				return false, "", err
			}
			for _, p := range claims.Items {
				if p.Labels[cdiv1.LabelOwnedByUID] == string(uid) || strings.Contains(p.Name, string(uid)) {
					left = append(left, fmt.Sprintf("claim %s/%s (%s, finalizers %v)", n, p.Name, p.Status.Phase, p.Finalizers))
				}
			}
			for _, p := range pods.Items {
				if p.Labels[cdiv1.LabelOwnedByUID] == string(uid) || strings.Contains(p.Name, string(uid)) {
					left = append(left, fmt.Sprintf("pod %s/%s (%s)", n, p.Name, p.Status.Phase))
				}
			}
			for _, sn := range snaps.Items {
				if sn.DeletionTimestamp != nil && kit.OnlyProvisionerFinalizers(sn.Finalizers) {
					// Deleted by Kubefill; external-provisioner's
					// volumesnapshot-as-source-protection holds it until its
					// next resync of the restored (and already deleted) claim.
					if !heldSnapshots[sn.Name] {
						heldSnapshots[sn.Name] = true
						t.Logf("snapshot %s/%s deleted, held by %v", n, sn.Name, sn.Finalizers)
					}
					continue
				}
				if sn.Labels[cdiv1.LabelOwnedByUID] == string(uid) || strings.Contains(sn.Name, string(uid)) {
					left = append(left, fmt.Sprintf("snapshot %s/%s (finalizers %v)", n, sn.Name, sn.Finalizers))
				}
			}
			vcs := &cdiv1.VolumeCloneSourceList{}
			if err := s.c.List(ctx, vcs, client.InNamespace(n)); err != nil {
				return false, "", err
			}
			for _, v := range vcs.Items {
				if dvUID == "" || v.Name != "volume-clone-source-"+string(dvUID) {
					continue
				}
				// Within one namespace the DataVolume owns its
				// VolumeCloneSource, and the garbage collector takes it
				// with the DataVolume; across namespaces nothing would, so
				// it must be gone.
				if ns == srcNs && slices.ContainsFunc(v.OwnerReferences, func(o metav1.OwnerReference) bool { return o.UID == dvUID && ptr.Deref(o.Controller, false) }) {
					continue
				}
				left = append(left, fmt.Sprintf("VolumeCloneSource %s/%s (owners %v)", n, v.Name, v.OwnerReferences))
			}
		}
		claims := &corev1.PersistentVolumeClaimList{}
		if err := s.c.List(ctx, claims, client.InNamespace(ns)); err != nil {
			return false, "", err
		}
		for _, p := range claims.Items {
			if p.UID == uid && hasFinalizer(p.Finalizers, cdiv1.FinalizerClonePopulator) {
				left = append(left, "finalizer "+cdiv1.FinalizerClonePopulator+" on claim "+ns+"/"+p.Name)
			}
		}
		return len(left) == 0, fmt.Sprintf("left: %v", left), nil
	})
}

func hasFinalizer(fs []string, f string) bool {
	for _, x := range fs {
		if x == f {
			return true
		}
	}
	return false
}

// waitEvent waits for an event of type and reason about object name in ns.
func (s *cloneStack) waitEvent(t *testing.T, ns, name, typ, reason string, timeout time.Duration) corev1.Event {
	t.Helper()
	var found corev1.Event
	kit.Eventually(t, timeout, 250*time.Millisecond, fmt.Sprintf("a %s event %s about %s/%s", typ, reason, ns, name), func() (bool, string, error) {
		list := &corev1.EventList{}
		if err := s.c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
			return false, "", err
		}
		var about []corev1.Event
		for _, e := range list.Items {
			if e.InvolvedObject.Name != name {
				continue
			}
			about = append(about, e)
			if e.Type == typ && e.Reason == reason {
				found = e
				return true, "", nil
			}
		}
		return false, "events about it:\n" + kit.FormatEvents(about), nil
	})
	return found
}

// assertBytes reads the clones (ns/name → block) and the check fails for
// each whose first cloneDataSize bytes differ from want.
func assertBytes(t *testing.T, ns string, want string, claims map[string]bool) {
	t.Helper()
	got := readClaims(t, ns, cloneDataSize, claims)
	for name := range claims {
		if got[name] != want {
			t.Errorf("clone %s/%s holds sha256 %q over its first %d bytes, the source %s", ns, name, got[name], cloneDataSize, want)
		}
	}
}

// userClient is a client that impersonates user (no groups but
// system:authenticated).
func (s *cloneStack) userClient(t *testing.T, user string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(cl.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: user, Groups: []string{"system:authenticated"}}
	c, err := client.New(cfg, client.Options{Scheme: s.c.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// grant gives user the rules in ns through a Role and a RoleBinding.
func (s *cloneStack) grant(t *testing.T, ns, user string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	name := "clone-e2e-" + strings.ToLower(user) + "-" + randomSuffix()
	s.create(t, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Rules: rules})
	s.create(t, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	})
}

// snapshotOf takes a VolumeSnapshot of claim ns/name with the cluster's
// snapshot class and waits until it is ready to use.
func (s *cloneStack) snapshotOf(t *testing.T, ns, claim, name string) *snapshotv1.VolumeSnapshot {
	t.Helper()
	snap := &snapshotv1.VolumeSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: snapshotv1.VolumeSnapshotSpec{
			Source:                  snapshotv1.VolumeSnapshotSource{PersistentVolumeClaimName: ptr.To(claim)},
			VolumeSnapshotClassName: ptr.To(cluster.VolumeSnapshotClass),
		},
	}
	s.create(t, snap)
	return kit.Await(t, time.Minute, 200*time.Millisecond, "VolumeSnapshot "+ns+"/"+name+" to be ready",
		func() (*snapshotv1.VolumeSnapshot, error) {
			got := &snapshotv1.VolumeSnapshot{}
			return got, s.c.Get(context.Background(), client.ObjectKeyFromObject(snap), got)
		},
		func(sn *snapshotv1.VolumeSnapshot) bool {
			return sn.Status != nil && ptr.Deref(sn.Status.ReadyToUse, false) && sn.Status.RestoreSize != nil
		}, nil)
}

// slowSnapshotClass creates a VolumeSnapshotClass of the test driver whose
// CreateSnapshot takes delay, removed after the test; it is not the default.
func (s *cloneStack) slowSnapshotClass(t *testing.T, delay string) string {
	t.Helper()
	name := "clone-slow-snap-" + randomSuffix()
	vsc := &snapshotv1.VolumeSnapshotClass{
		ObjectMeta:     metav1.ObjectMeta{Name: name},
		Driver:         cluster.DriverName,
		DeletionPolicy: snapshotv1.VolumeSnapshotContentDelete,
		Parameters:     map[string]string{hostpath.DelayParameter: delay},
	}
	s.create(t, vsc)
	t.Cleanup(func() { _ = s.c.Delete(context.Background(), vsc) })
	return name
}

// capacity is a claim's status capacity.
func capacity(pvc *corev1.PersistentVolumeClaim) resource.Quantity {
	return pvc.Status.Capacity[corev1.ResourceStorage]
}

// claimMisbound lists the ClaimMisbound events in ns, about claims named
// in names (all claims when names is nil).
func (s *cloneStack) claimMisbound(t *testing.T, ns string, names map[string]bool) []string {
	t.Helper()
	list := &corev1.EventList{}
	if err := s.c.List(context.Background(), list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Reason == "ClaimMisbound" && (names == nil || names[e.InvolvedObject.Name]) {
			out = append(out, fmt.Sprintf("%s: %s", e.InvolvedObject.Name, e.Message))
		}
	}
	return out
}

// slowStepInFlight is kit.CloneStepInFlight through the stack's client.
func (s *cloneStack) slowStepInFlight(ctx context.Context, st cdiv1.CDICloneStrategy, srcNs, uid string) string {
	return kit.CloneStepInFlight(ctx, s.c, st, srcNs, uid)
}
