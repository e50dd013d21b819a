package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	snapshotv1 "github.com/kubernetes-csi/external-snapshotter/client/v6/apis/volumesnapshot/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/internal/registry"
	"github.com/kubefill/kubefill/tests/kit"
)

// goldenDiskSize is the size of the test's disk images: small, so that
// each import takes seconds.
const goldenDiskSize = 4 << 20

// goldenDisk is disk image number i: zeros with three 64 KiB stretches of
// a pattern of its own, so each push has its own digest and its own bytes.
func goldenDisk(i int) (disk []byte, sha string) {
	disk = make([]byte, goldenDiskSize)
	for _, off := range []int{0, 1 << 20, 3 << 20} {
		for j := 0; j < 64<<10; j++ {
			disk[off+j] = byte(j*7 + i*131 + off>>16)
		}
	}
	sum := sha256.Sum256(disk)
	return disk, hex.EncodeToString(sum[:])
}

// goldenCron is a cron polling url every minute into DataSource ds.
func goldenCron(ns, name, ds, url, caConfigMap, class string) *cdiv1.DataImportCron {
	return &cdiv1.DataImportCron{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: cdiv1.DataImportCronSpec{
			Schedule:          "* * * * *",
			ManagedDataSource: ds,
			Template: cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{
				Source: &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: &url, CertConfigMap: &caConfigMap}},
				Storage: &cdiv1.StorageSpec{StorageClassName: &class,
					Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("32Mi")}}},
			}},
		},
	}
}

// kubevirtDataVolume is a DataVolume as KubeVirt's virt-controller renders
// one from a VM's dataVolumeTemplates: created-by label, claim adoption
// allowed, the VM as controlling owner (a ConfigMap stands in for the VM:
// no KubeVirt here), a sourceRef to a DataSource in another namespace.
func kubevirtDataVolume(ns, name string, vm *corev1.ConfigMap, dsNs, ds, class string) *cdiv1.DataVolume {
	dv := kit.DataVolume(ns, name, nil, kit.WithStorage(class, "32Mi"))
	dv.Labels = map[string]string{"kubevirt.io/created-by": string(vm.UID)}
	dv.Annotations = map[string]string{cdiv1.AnnAllowClaimAdoption: "true"}
	dv.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: vm.Name, UID: vm.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	dv.Spec.SourceRef = &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Namespace: ptr.To(dsNs), Name: ds}
	return dv
}

// registryCA puts the registry's CA in a ConfigMap where the importer (the
// cron's namespace) and the poller (the install namespace, as CDI's poller)
// mount it, and returns its name: one of the test's own, since the install
// namespace is shared and each test's registry has a CA of its own.
func registryCA(t *testing.T, s *cloneStack, reg *registry.Server, ns string) string {
	t.Helper()
	name := "registry-ca-" + randomSuffix()
	for _, n := range []string{ns, s.installNS} {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: n, Name: name}, Data: map[string]string{"ca.crt": string(reg.CAPEM)}}
		if err := s.c.Create(context.Background(), cm); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.c.Delete(context.Background(), cm) })
	}
	return name
}

// createCron creates a cron and deletes it when the test ends.
func (s *cloneStack) createCron(t *testing.T, cron *cdiv1.DataImportCron) {
	t.Helper()
	s.create(t, cron)
	t.Cleanup(func() { _ = s.c.Delete(context.Background(), cron) })
}

// diskSHA256 reads the first goldenDiskSize bytes of a claim's disk.img
// through a pod, then deletes the pod: a finished pod still holding the
// claim would keep it from being deleted.
func diskSHA256(t *testing.T, c client.Client, ns, claim string) string {
	t.Helper()
	sum := claimSHA256(t, ns, claim, goldenDiskSize)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "read-" + claim}}
	if err := c.Delete(context.Background(), pod, client.GracePeriodSeconds(0)); client.IgnoreNotFound(err) != nil {
		t.Fatal(err)
	}
	return sum
}

func importName(ds, digest string) string {
	return ds + "-" + strings.TrimPrefix(digest, "sha256:")[:12]
}

// waitDataSource waits until the DataSource is Ready and points at claim.
func (s *cloneStack) waitDataSource(t *testing.T, ns, name, claim string, timeout time.Duration) *cdiv1.DataSource {
	t.Helper()
	return kit.Await(t, timeout, 250*time.Millisecond, fmt.Sprintf("DataSource %s/%s Ready on %s", ns, name, claim),
		func() (*cdiv1.DataSource, error) {
			ds := &cdiv1.DataSource{}
			err := s.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, ds)
			if apierrors.IsNotFound(err) {
				return ds, nil
			}
			return ds, err
		},
		func(ds *cdiv1.DataSource) bool {
			if !dataSourceReady(ds) {
				return false
			}
			if claim == "" {
				return true
			}
			src := ds.Spec.Source
			return (src.PVC != nil && src.PVC.Name == claim) || (src.Snapshot != nil && src.Snapshot.Name == claim)
		},
		func(ds *cdiv1.DataSource) string {
			return fmt.Sprintf("labels %v spec %+v status %+v\ncron namespace events:\n%s", ds.Labels, ds.Spec.Source, ds.Status, eventsFor(ns, ""))
		})
}

func dataSourceReady(ds *cdiv1.DataSource) bool {
	for _, c := range ds.Status.Conditions {
		if c.Type == cdiv1.DataSourceReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func cronImports(t *testing.T, c client.Client, ns, cron string) []string {
	t.Helper()
	list := &cdiv1.DataVolumeList{}
	if err := c.List(context.Background(), list, client.InNamespace(ns), client.MatchingLabels{cdiv1.LabelDataImportCron: cron}); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, dv := range list.Items {
		if dv.DeletionTimestamp == nil {
			out = append(out, dv.Name)
		}
	}
	slices.Sort(out)
	return out
}

// runCronJobNow starts the CronJob's job template as a Job, what `kubectl
// create job --from=cronjob/...` does: the same poller pod, without waiting
// for the next minute.
func runCronJobNow(t *testing.T, c client.Client, ns, name string) {
	t.Helper()
	cj := &batchv1.CronJob{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, cj); err != nil {
		t.Fatal(err)
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, GenerateName: name + "-manual-", Labels: cj.Labels,
			Annotations: map[string]string{"cronjob.kubernetes.io/instantiate": "manual"}},
		Spec: cj.Spec.JobTemplate.Spec,
	}
	if err := c.Create(context.Background(), job); err != nil {
		t.Fatal(err)
	}
}

// TestGoldenImageCron: a DataImportCron polls a containerdisk in a real
// registry on the host through its CronJob (run by the real
// kube-controller-manager, its poller pod on the real kubelet); each new
// push is imported and the DataSource moves to it; importsToKeep are kept;
// a DataVolume rendered as KubeVirt renders one clones from the DataSource;
// the cron's instancetype labels reach the DataSource; retentionPolicy None
// removes everything with the cron.
func TestGoldenImageCron(t *testing.T) {
	parallel(t)
	s := shared
	ctx := context.Background()
	gw, err := cl.GatewayAddress()
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.Start(t, registry.Options{Address: gw, TLS: true})
	golden, vms := s.namespace(t, "golden"), s.namespace(t, "vms")
	ca := registryCA(t, s, reg, golden)
	const repo = "containerdisks/tiny:latest"
	disk1, sha1 := goldenDisk(1)
	d1 := reg.PushDisk(t, repo, disk1)

	cron := goldenCron(golden, "tiny-image-cron", "tiny", reg.URL(repo), ca, cluster.StorageClassImmediate)
	cron.Labels = map[string]string{cdiv1.LabelDefaultPreference: "tiny.small", cdiv1.LabelDefaultInstancetype: "u1.small"}
	cron.Spec.ImportsToKeep = ptr.To[int32](2)
	cron.Spec.RetentionPolicy = ptr.To(cdiv1.DataImportCronRetainNone)
	vm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: vms, Name: "vm-stand-in"}}
	s.create(t, vm)
	// A KubeVirt-shaped DataVolume made before the cron, while its DataSource
	// does not exist yet (a VM created with its golden image): admitted with
	// a token for the DataSource's namespace, it waits saying so, and clones
	// the first import once the DataSource names it.
	early := kubevirtDataVolume(vms, "early-rootdisk", vm, golden, "tiny", cluster.StorageClassImmediate)
	s.create(t, early)
	kit.Eventually(t, time.Minute, 250*time.Millisecond, "the early DataVolume to say it waits for its DataSource", func() (bool, string, error) {
		dv := &cdiv1.DataVolume{}
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(early), dv); err != nil {
			return false, "", err
		}
		for _, c := range dv.Status.Conditions {
			if c.Type == cdiv1.DataVolumeRunning && c.Reason == "DataSourceNotFound" {
				t.Logf("early DataVolume: Running=%s %s: %s", c.Status, c.Reason, c.Message)
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("conditions %+v", dv.Status.Conditions), nil
	})
	start := time.Now()
	s.createCron(t, cron)
	// The initial Job polls at once: the first import.
	name1 := importName("tiny", d1)
	ds := s.waitDataSource(t, golden, "tiny", name1, 3*time.Minute)
	t.Logf("first import %s: DataSource Ready %s after the cron was created", name1, time.Since(start).Round(100*time.Millisecond))
	for k, v := range map[string]string{cdiv1.LabelDataImportCron: cron.Name, cdiv1.LabelDataImportCronCleanup: "true"} {
		if ds.Labels[k] != v {
			t.Errorf("DataSource label %s=%q, want %q", k, ds.Labels[k], v)
		}
	}
	kit.Eventually(t, time.Minute, 250*time.Millisecond, "the instancetype labels to reach the DataSource", func() (bool, string, error) {
		ds := &cdiv1.DataSource{}
		if err := s.c.Get(ctx, types.NamespacedName{Namespace: golden, Name: "tiny"}, ds); err != nil {
			return false, "", err
		}
		return ds.Labels[cdiv1.LabelDefaultPreference] == "tiny.small" && ds.Labels[cdiv1.LabelDefaultInstancetype] == "u1.small", fmt.Sprintf("labels %v", ds.Labels), nil
	})
	if got := diskSHA256(t, s.c, golden, name1); got != sha1 {
		t.Errorf("import %s holds sha256 %s, the pushed disk %s", name1, got, sha1)
	}
	s.waitCloned(t, vms, early.Name, golden, cloneTimeout)
	if got := diskSHA256(t, s.c, vms, early.Name); got != sha1 {
		t.Errorf("the early clone holds sha256 %s, the first import %s", got, sha1)
	}
	t.Logf("early DataVolume cloned the first import %s after the cron was created", time.Since(start).Round(100*time.Millisecond))
	c := &cdiv1.DataImportCron{}
	if err := s.c.Get(ctx, client.ObjectKeyFromObject(cron), c); err != nil {
		t.Fatal(err)
	}
	if c.Status.LastImportedPVC == nil || c.Status.LastImportedPVC.Name != name1 || ptr.Deref(c.Status.SourceFormat, "") != cdiv1.DataImportCronSourceFormatPvc ||
		c.Status.LastExecutionTimestamp == nil || c.Status.LastImportTimestamp == nil {
		t.Errorf("cron status after the first import: %+v", c.Status)
	}
	dv1 := &cdiv1.DataVolume{}
	if err := s.c.Get(ctx, types.NamespacedName{Namespace: golden, Name: name1}, dv1); err != nil {
		t.Fatal(err)
	}
	if got, want := *dv1.Spec.Source.Registry.URL, reg.URL("containerdisks/tiny")+"@"+d1; got != want {
		t.Errorf("import URL %s, want %s", got, want)
	}

	// A new push under the same tag: the CronJob's next run (the real
	// CronJob controller, at the next minute) imports it.
	disk2, sha2 := goldenDisk(2)
	d2 := reg.PushDisk(t, repo, disk2)
	pushed := time.Now()
	name2 := importName("tiny", d2)
	s.waitDataSource(t, golden, "tiny", name2, 3*time.Minute)
	t.Logf("second import %s: DataSource moved %s after the push (the CronJob runs every minute)", name2, time.Since(pushed).Round(100*time.Millisecond))
	if got := diskSHA256(t, s.c, golden, name2); got != sha2 {
		t.Errorf("import %s holds sha256 %s, want %s", name2, got, sha2)
	}

	// Two more pushes, each polled at once by a Job made from the CronJob:
	// importsToKeep 2 leaves the last two.
	var name4 string
	var sha4 string
	for i := 3; i <= 4; i++ {
		disk, sha := goldenDisk(i)
		d := reg.PushDisk(t, repo, disk)
		pushed = time.Now()
		runCronJobNow(t, s.c, s.installNS, controller.CronJobName(c))
		name4, sha4 = importName("tiny", d), sha
		s.waitDataSource(t, golden, "tiny", name4, 3*time.Minute)
		t.Logf("import %d %s: DataSource moved %s after the push", i, name4, time.Since(pushed).Round(100*time.Millisecond))
		time.Sleep(50 * time.Millisecond)
	}
	var prev string
	kit.Eventually(t, time.Minute, 250*time.Millisecond, "importsToKeep 2", func() (bool, string, error) {
		got := cronImports(t, s.c, golden, cron.Name)
		if len(got) == 2 && slices.Contains(got, name4) {
			prev = got[0]
			if prev == name4 {
				prev = got[1]
			}
			return true, "", nil
		}
		return false, fmt.Sprintf("imports %v", got), nil
	})
	t.Logf("after four pushes the cron keeps %s and %s", prev, name4)
	if err := s.c.Get(ctx, client.ObjectKeyFromObject(cron), c); err != nil {
		t.Fatal(err)
	}
	for _, cond := range c.Status.Conditions {
		t.Logf("cron condition %s=%s %s: %s", cond.Type, cond.Status, cond.Reason, cond.Message)
	}
	t.Logf("cron status: currentImports %+v lastImportedPVC %+v sourceFormat %s lastExecutionTimestamp %s",
		c.Status.CurrentImports, c.Status.LastImportedPVC, ptr.Deref(c.Status.SourceFormat, ""), c.Status.LastExecutionTimestamp)

	// A KubeVirt-shaped clone of the newest image.
	late := kubevirtDataVolume(vms, "late-rootdisk", vm, golden, "tiny", cluster.StorageClassImmediate)
	s.create(t, late)
	s.waitCloned(t, vms, late.Name, golden, cloneTimeout)
	if got := diskSHA256(t, s.c, vms, late.Name); got != sha4 {
		t.Errorf("the late clone holds sha256 %s, want %s", got, sha4)
	}

	// retentionPolicy None: deleting the cron deletes its imports, their
	// claims, the DataSource and the poller's CronJob and Jobs; the clones stay.
	if err := s.c.Delete(ctx, cron); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	kit.Eventually(t, 2*time.Minute, 250*time.Millisecond, "the cron's objects to go", func() (bool, string, error) {
		imports := cronImports(t, s.c, golden, cron.Name)
		claims := &corev1.PersistentVolumeClaimList{}
		if err := s.c.List(ctx, claims, client.InNamespace(golden), client.MatchingLabels{cdiv1.LabelDataImportCron: cron.Name}); err != nil {
			return false, "", err
		}
		dsErr := s.c.Get(ctx, types.NamespacedName{Namespace: golden, Name: "tiny"}, &cdiv1.DataSource{})
		cjs := &batchv1.CronJobList{}
		if err := s.c.List(ctx, cjs, client.InNamespace(s.installNS), client.MatchingLabels{cdiv1.LabelDataImportCronNs: golden}); err != nil {
			return false, "", err
		}
		return len(imports) == 0 && len(claims.Items) == 0 && apierrors.IsNotFound(dsErr) && len(cjs.Items) == 0,
			fmt.Sprintf("imports %v, claims %d, DataSource %v, CronJobs %d", imports, len(claims.Items), dsErr, len(cjs.Items)), nil
	})
	t.Logf("retentionPolicy None: everything went %s after the cron", time.Since(deleted).Round(100*time.Millisecond))
	for _, n := range []string{early.Name, late.Name} {
		if err := s.c.Get(ctx, types.NamespacedName{Namespace: vms, Name: n}, &cdiv1.DataVolume{}); err != nil {
			t.Errorf("clone %s after the cron went: %v", n, err)
		}
	}
}

// TestGoldenImageSnapshotFormat: on a class whose StorageProfile says
// dataImportCronSourceFormat snapshot, the import is snapshotted, its claim
// deleted once the snapshot is ready, and the DataSource points at the
// snapshot; a KubeVirt-shaped DataVolume made while the snapshot is not
// ready waits, saying so, then clones from it.
func TestGoldenImageSnapshotFormat(t *testing.T) {
	parallel(t)
	s := shared
	ctx := context.Background()
	gw, err := cl.GatewayAddress()
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.Start(t, registry.Options{Address: gw, TLS: true})
	// Snapshots of this class take 15 s: the DataSource points at the
	// import's snapshot before it is ready to use.
	class := s.cloneClass(t, classOpts{strategy: cdiv1.CloneStrategySnapshot, snapshotClass: s.slowSnapshotClass(t, "15s")})
	kit.Eventually(t, time.Minute, 200*time.Millisecond, "StorageProfile "+class+" to say snapshot format", func() (bool, string, error) {
		p := &cdiv1.StorageProfile{}
		if err := s.c.Get(ctx, types.NamespacedName{Name: class}, p); err != nil {
			return false, "", err
		}
		if ptr.Deref(p.Spec.DataImportCronSourceFormat, "") != cdiv1.DataImportCronSourceFormatSnapshot {
			p.Spec.DataImportCronSourceFormat = ptr.To(cdiv1.DataImportCronSourceFormatSnapshot)
			return false, "spec being set", s.c.Update(ctx, p)
		}
		return ptr.Deref(p.Status.DataImportCronSourceFormat, "") == cdiv1.DataImportCronSourceFormatSnapshot, fmt.Sprintf("status %+v", p.Status), nil
	})
	golden, vms := s.namespace(t, "golden-snap"), s.namespace(t, "vms-snap")
	ca := registryCA(t, s, reg, golden)
	disk, sha := goldenDisk(7)
	d := reg.PushDisk(t, "containerdisks/snap:1", disk)
	cron := goldenCron(golden, "snap-cron", "snap", reg.URL("containerdisks/snap:1"), ca, class)
	cron.Labels = map[string]string{cdiv1.LabelDefaultPreference: "snap.pref"}
	s.createCron(t, cron)
	name := importName("snap", d)
	vm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: vms, Name: "vm-stand-in"}}
	s.create(t, vm)
	// The import succeeded, its snapshot is being taken: the DataSource
	// names the snapshot but is not Ready. A VM's DataVolume made now waits,
	// saying so, and proceeds once the snapshot is ready.
	kit.Eventually(t, 3*time.Minute, 100*time.Millisecond, "the DataSource to name the snapshot, not ready yet", func() (bool, string, error) {
		ds := &cdiv1.DataSource{}
		if err := s.c.Get(ctx, types.NamespacedName{Namespace: golden, Name: "snap"}, ds); err != nil {
			return false, "", client.IgnoreNotFound(err)
		}
		if dataSourceReady(ds) {
			return false, "", fmt.Errorf("DataSource became Ready before the test saw it wait: %+v", ds.Status)
		}
		return ds.Spec.Source.Snapshot != nil && ds.Spec.Source.Snapshot.Name == name, fmt.Sprintf("source %+v status %+v", ds.Spec.Source, ds.Status), nil
	})
	dv := kubevirtDataVolume(vms, "rootdisk", vm, golden, "snap", class)
	s.create(t, dv)
	var waited string
	kit.Eventually(t, time.Minute, 100*time.Millisecond, "the DataVolume to say it waits for the DataSource", func() (bool, string, error) {
		got := &cdiv1.DataVolume{}
		if err := s.c.Get(ctx, client.ObjectKeyFromObject(dv), got); err != nil {
			return false, "", err
		}
		for _, c := range got.Status.Conditions {
			if strings.Contains(c.Message, "DataSource "+golden+"/snap is not ready") {
				waited = c.Reason + ": " + c.Message
				return true, "", nil
			}
		}
		return false, fmt.Sprintf("phase %s conditions %+v", got.Status.Phase, got.Status.Conditions), nil
	})
	t.Logf("the VM's DataVolume waited: %s", waited)
	ds := s.waitDataSource(t, golden, "snap", name, 3*time.Minute)
	if ds.Spec.Source.Snapshot == nil || ds.Spec.Source.Snapshot.Name != name {
		t.Fatalf("DataSource source %+v, want snapshot %s", ds.Spec.Source, name)
	}
	snap := &snapshotv1.VolumeSnapshot{}
	if err := s.c.Get(ctx, types.NamespacedName{Namespace: golden, Name: name}, snap); err != nil {
		t.Fatal(err)
	}
	if snap.Labels[cdiv1.LabelDataImportCron] != cron.Name || snap.Labels[cdiv1.LabelDefaultPreference] != "snap.pref" || snap.Annotations[cdiv1.AnnLastUseTime] == "" {
		t.Errorf("snapshot labels %v annotations %v", snap.Labels, snap.Annotations)
	}
	kit.Eventually(t, time.Minute, 250*time.Millisecond, "the import's claim to go and the cron to be up to date", func() (bool, string, error) {
		err := s.c.Get(ctx, types.NamespacedName{Namespace: golden, Name: name}, &corev1.PersistentVolumeClaim{})
		c := &cdiv1.DataImportCron{}
		if gerr := s.c.Get(ctx, client.ObjectKeyFromObject(cron), c); gerr != nil {
			return false, "", gerr
		}
		upToDate := false
		for _, cond := range c.Status.Conditions {
			if cond.Type == cdiv1.DataImportCronUpToDate && cond.Status == corev1.ConditionTrue {
				upToDate = true
			}
		}
		return apierrors.IsNotFound(err) && upToDate && ptr.Deref(c.Status.SourceFormat, "") == cdiv1.DataImportCronSourceFormatSnapshot,
			fmt.Sprintf("claim: %v; status %+v", err, c.Status), nil
	})
	_, seen := s.waitCloned(t, vms, dv.Name, golden, cloneTimeout)
	t.Logf("clone from the snapshot-format DataSource: phases %v", seen)
	if got := diskSHA256(t, s.c, vms, dv.Name); got != sha {
		t.Errorf("the clone holds sha256 %s, want %s", got, sha)
	}
	if err := s.c.Delete(ctx, cron); err != nil {
		t.Fatal(err)
	}
}
