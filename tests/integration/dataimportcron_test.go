package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/poller"
	"github.com/kubefill/kubefill/tests/internal/registry"
	"github.com/kubefill/kubefill/tests/kit"
)

// startCronController runs the DataImportCron controller alone (no
// DataVolume controller: the tests play its part through the status), its
// pollers' CronJobs in installNS.
func startCronController(t *testing.T, installNS string) {
	t.Helper()
	startCronControllerAs(t, cfg, installNS, true)
}

// startCronControllerAs runs the DataImportCron controller (and, with
// dataSources, the DataSource controller) through restCfg, its pollers'
// CronJobs in installNS; a refused cron is asked again and poller copies
// are refreshed every second.
func startCronControllerAs(t *testing.T, restCfg *rest.Config, installNS string, dataSources bool) {
	t.Helper()
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                 controller.NewScheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := &controller.DataImportCronReconciler{Client: mgr.GetClient(), Recorder: mgr.GetEventRecorder("dataimportcron-controller"),
		Namespace: installNS, Image: "kubefill/kubefill:test", PullPolicy: corev1.PullIfNotPresent,
		NotAuthorizedRetry: time.Second, PollerCopyResync: time.Second}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	if dataSources {
		if err := (&controller.DataSourceReconciler{Client: mgr.GetClient()}).SetupWithManager(mgr); err != nil {
			t.Fatal(err)
		}
	}
	startUntilCleanup(t, mgr)
}

func registryCron(ns, name, url string, mutate ...func(*cdiv1.DataImportCron)) *cdiv1.DataImportCron {
	c := &cdiv1.DataImportCron{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: cdiv1.DataImportCronSpec{
			Schedule:          "* * * * *",
			ManagedDataSource: "fedora",
			Template: cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{
				Source:  &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: &url}},
				Storage: &cdiv1.StorageSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}}},
			}},
		},
	}
	for _, m := range mutate {
		m(c)
	}
	return c
}

// poll runs one real `kubefill poller` pass (the package, against the test
// registry) for the cron, as its CronJob's pod would.
func poll(t *testing.T, cron *cdiv1.DataImportCron) string {
	t.Helper()
	d, _, err := poller.Run(context.Background(), k8sClient, poller.Job{Namespace: cron.Namespace, Cron: cron.Name,
		Registry: poller.Registry{URL: *cron.Spec.Template.Spec.Source.Registry.URL}}, time.Now, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func getCron(t *testing.T, ns, name string) *cdiv1.DataImportCron {
	t.Helper()
	c := &cdiv1.DataImportCron{}
	if err := k8sClient.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, c); err != nil {
		t.Fatal(err)
	}
	return c
}

func cronCondition(c *cdiv1.DataImportCron, typ cdiv1.DataImportCronConditionType) string {
	for _, cond := range c.Status.Conditions {
		if cond.Type == typ {
			return string(cond.Status) + "/" + cond.Reason
		}
	}
	return "absent"
}

// waitDV waits for a DataVolume to exist.
func waitDV(t *testing.T, ns, name string) *cdiv1.DataVolume {
	t.Helper()
	return kit.Await(t, 30*time.Second, 100*time.Millisecond, "DataVolume "+ns+"/"+name, func() (*cdiv1.DataVolume, error) {
		dv := &cdiv1.DataVolume{}
		err := k8sClient.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, dv)
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return dv, err
	}, func(dv *cdiv1.DataVolume) bool { return dv != nil }, func(*cdiv1.DataVolume) string { return "absent" })
}

// succeed plays the DataVolume controller: the claim, bound, carrying the
// DataVolume's labels, and the DataVolume Succeeded.
func succeed(t *testing.T, dv *cdiv1.DataVolume) {
	t.Helper()
	ctx := context.Background()
	pvc := kit.PVC(dv.Namespace, dv.Name, "64Mi")
	pvc.Labels = dv.Labels
	pvc.OwnerReferences = []metav1.OwnerReference{{APIVersion: cdiv1.SchemeGroupVersion.String(), Kind: "DataVolume", Name: dv.Name, UID: dv.UID, Controller: ptr.To(true)}}
	if err := k8sClient.Create(ctx, pvc); err != nil {
		t.Fatal(err)
	}
	// The controllers of the other tests' namespaces run beside this one and
	// may touch the objects between the reads and the writes: write again on
	// a conflict, onto what is there now.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err != nil {
			return err
		}
		pvc.Status.Phase = corev1.ClaimBound
		return k8sClient.Status().Update(ctx, pvc)
	})
	if err != nil {
		t.Fatalf("marking claim %s Bound: %v", pvc.Name, err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(dv), dv); err != nil {
			return err
		}
		dv.Status.Phase = cdiv1.Succeeded
		dv.Status.Progress = "100.0%"
		return k8sClient.Status().Update(ctx, dv)
	})
	if err != nil {
		t.Fatalf("marking DataVolume %s Succeeded: %v", dv.Name, err)
	}
}

func waitCron(t *testing.T, ns, name, what string, done func(*cdiv1.DataImportCron) bool) *cdiv1.DataImportCron {
	t.Helper()
	return kit.Await(t, 30*time.Second, 100*time.Millisecond, what, func() (*cdiv1.DataImportCron, error) {
		c := &cdiv1.DataImportCron{}
		return c, k8sClient.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, c)
	}, done, func(c *cdiv1.DataImportCron) string {
		return fmt.Sprintf("annotations %v status %+v", c.Annotations, c.Status)
	})
}

func listDVNames(t *testing.T, ns string) []string {
	t.Helper()
	list := &cdiv1.DataVolumeList{}
	if err := k8sClient.List(context.Background(), list, client.InNamespace(ns)); err != nil {
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

// outdatedSeries reads kubevirt_cdi_dataimportcron_outdated for a cron:
// its value and pending label, and whether the series exists.
func outdatedSeries(t *testing.T, ns, name string) (value float64, pending string, found bool) {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	go func() { controller.OutdatedGauge().Collect(ch); close(ch) }()
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		labels := map[string]string{}
		for _, l := range d.Label {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["ns"] == ns && labels["cron_name"] == name {
			value, pending, found = d.GetGauge().GetValue(), labels["pending"], true
		}
	}
	return value, pending, found
}

// TestDataImportCronImportsEachDigest: the poller's CronJob and initial Job
// are rendered as CDI's; each digest the poller records becomes a
// DataVolume <dataSource>-<12 digest chars> importing <url>@<digest> with
// CDI's labels and annotations; when it succeeds the managed DataSource
// points at it, and garbage collection keeps the last three.
func TestDataImportCronImportsEachDigest(t *testing.T) {
	ctx := context.Background()
	installNS, ns := newNamespace(t), newNamespace(t)
	reg := registry.Start(t, registry.Options{})
	startCronController(t, installNS)

	url := reg.URL("os/fedora:40")
	first := reg.PushDisk(t, "os/fedora:40", []byte("first disk"))
	cron := registryCron(ns, "fedora-image-cron", url, func(c *cdiv1.DataImportCron) {
		c.Labels = map[string]string{cdiv1.LabelDefaultPreference: "fedora"}
		c.Spec.Template.Labels = map[string]string{"from-template": "yes"}
	})
	createCron(t, cron)

	// The poller's CronJob and initial Job, in the install namespace.
	cjName := controller.CronJobName(cron)
	if want := "fedora-image-cron-" + string(cron.UID)[:8]; cjName != want {
		t.Fatalf("CronJob name %s, want %s", cjName, want)
	}
	cj := kit.Await(t, 30*time.Second, 100*time.Millisecond, "the poller CronJob", func() (*batchv1.CronJob, error) {
		cj := &batchv1.CronJob{}
		err := k8sClient.Get(ctx, types.NamespacedName{Namespace: installNS, Name: cjName}, cj)
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return cj, err
	}, func(cj *batchv1.CronJob) bool { return cj != nil }, func(*batchv1.CronJob) string { return "absent" })
	s := cj.Spec
	pod := s.JobTemplate.Spec.Template.Spec
	if s.Schedule != "* * * * *" || s.ConcurrencyPolicy != batchv1.ForbidConcurrent || *s.SuccessfulJobsHistoryLimit != 1 || *s.FailedJobsHistoryLimit != 1 ||
		*s.JobTemplate.Spec.BackoffLimit != 2 || *s.JobTemplate.Spec.TTLSecondsAfterFinished != 10 || pod.RestartPolicy != corev1.RestartPolicyNever ||
		pod.ServiceAccountName != controller.DefaultPollerServiceAccount {
		t.Errorf("CronJob spec %+v", s)
	}
	wantCmd := []string{"kubefill", "poller", "-ns", ns, "-cron", "fedora-image-cron", "-url", url}
	if c := pod.Containers[0]; !slices.Equal(c.Command, wantCmd) || c.Image != "kubefill/kubefill:test" {
		t.Errorf("poller container %q %v, want %v", c.Image, c.Command, wantCmd)
	}
	if sc := pod.SecurityContext; sc == nil || !ptr.Deref(sc.RunAsNonRoot, false) || sc.SeccompProfile == nil {
		t.Errorf("pod security %+v: not restricted", sc)
	}
	if sc := pod.Containers[0].SecurityContext; sc == nil || ptr.Deref(sc.AllowPrivilegeEscalation, true) || len(sc.Capabilities.Drop) != 1 {
		t.Errorf("container security %+v: not restricted", sc)
	}
	if cj.Labels[cdiv1.LabelDataImportCron] != "fedora-image-cron" || cj.Labels[cdiv1.LabelDataImportCronNs] != ns {
		t.Errorf("CronJob labels %v", cj.Labels)
	}
	job := kit.Await(t, 30*time.Second, 100*time.Millisecond, "the initial Job", func() (*batchv1.Job, error) {
		job := &batchv1.Job{}
		err := k8sClient.Get(ctx, types.NamespacedName{Namespace: installNS, Name: "initial-job-" + cjName}, job)
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return job, err
	}, func(j *batchv1.Job) bool { return j != nil }, func(*batchv1.Job) string { return "absent" })
	if !slices.Equal(job.Spec.Template.Spec.Containers[0].Command, wantCmd) {
		t.Errorf("initial Job command %v", job.Spec.Template.Spec.Containers[0].Command)
	}

	// Before any poll: no digest; the DataSource exists, labelled, with no source.
	c := waitCron(t, ns, cron.Name, "UpToDate NoDigest", func(c *cdiv1.DataImportCron) bool {
		return cronCondition(c, cdiv1.DataImportCronUpToDate) == "False/NoDigest"
	})
	ds := &cdiv1.DataSource{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "fedora"}, ds); err != nil {
		t.Fatalf("the managed DataSource: %v", err)
	}
	if ds.Labels[cdiv1.LabelDataImportCron] != cron.Name || ds.Spec.Source.PVC != nil {
		t.Errorf("DataSource before an import: labels %v source %+v", ds.Labels, ds.Spec.Source)
	}
	_ = c

	var names []string
	digests := []string{first}
	for i := 0; i < 4; i++ {
		if i > 0 {
			digests = append(digests, reg.PushDisk(t, "os/fedora:40", []byte(fmt.Sprintf("disk number %d", i))))
		}
		d := digests[i]
		if got := poll(t, cron); got != d {
			t.Fatalf("poll %d read %s, want %s", i, got, d)
		}
		name := "fedora-" + strings.TrimPrefix(d, "sha256:")[:12]
		names = append(names, name)
		dv := waitDV(t, ns, name)
		if got, want := *dv.Spec.Source.Registry.URL, reg.URL("os/fedora")+"@"+d; got != want {
			t.Errorf("import %d URL %s, want %s", i, got, want)
		}
		for k, v := range map[string]string{cdiv1.LabelDataImportCron: cron.Name, cdiv1.LabelDefaultPreference: "fedora", "from-template": "yes"} {
			if dv.Labels[k] != v {
				t.Errorf("import %d label %s=%q, want %q", i, k, dv.Labels[k], v)
			}
		}
		if dv.Annotations[cdiv1.AnnImmediateBinding] != "true" || dv.Annotations[cdiv1.AnnLastUseTime] == "" {
			t.Errorf("import %d annotations %v", i, dv.Annotations)
		}
		c = waitCron(t, ns, cron.Name, "the import in currentImports, Outdated", func(c *cdiv1.DataImportCron) bool {
			u := cronCondition(c, cdiv1.DataImportCronUpToDate)
			return len(c.Status.CurrentImports) == 1 && c.Status.CurrentImports[0].DataVolumeName == name && c.Status.CurrentImports[0].Digest == d &&
				(u == "False/Outdated" || u == "False/ImportProgressing")
		})
		if c.Status.LastExecutionTimestamp == nil {
			t.Errorf("import %d: no lastExecutionTimestamp after a poll", i)
		}
		if v, _, ok := outdatedSeries(t, ns, cron.Name); !ok || v != 1 {
			t.Errorf("import %d outdated: kubevirt_cdi_dataimportcron_outdated %v (series exists: %v), want 1", i, v, ok)
		}
		// ImportInProgress shows in Progressing.
		dv.Status.Phase = cdiv1.ImportInProgress
		if err := k8sClient.Status().Update(ctx, dv); err != nil {
			t.Fatal(err)
		}
		waitCron(t, ns, cron.Name, "Progressing True", func(c *cdiv1.DataImportCron) bool {
			return cronCondition(c, cdiv1.DataImportCronProgressing) == "True/ImportProgressing"
		})
		dv = waitDV(t, ns, name)
		succeed(t, dv)
		c = waitCron(t, ns, cron.Name, "UpToDate after the import succeeded", func(c *cdiv1.DataImportCron) bool {
			return cronCondition(c, cdiv1.DataImportCronUpToDate) == "True/UpToDate" && c.Status.LastImportedPVC != nil && c.Status.LastImportedPVC.Name == name
		})
		if v, pending, ok := outdatedSeries(t, ns, cron.Name); !ok || v != 0 || pending != "false" {
			t.Errorf("import %d up to date: kubevirt_cdi_dataimportcron_outdated %v pending=%s (series exists: %v), want 0", i, v, pending, ok)
		}
		if c.Status.LastImportTimestamp == nil || ptr.Deref(c.Status.SourceFormat, "") != cdiv1.DataImportCronSourceFormatPvc ||
			cronCondition(c, cdiv1.DataImportCronProgressing) != "False/NoImport" {
			t.Errorf("import %d status %+v", i, c.Status)
		}
		kit.Eventually(t, 30*time.Second, 100*time.Millisecond, "the DataSource to point at "+name+", Ready, with the cron's instancetype label", func() (bool, string, error) {
			ds := &cdiv1.DataSource{}
			if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "fedora"}, ds); err != nil {
				return false, "", err
			}
			p := ds.Spec.Source.PVC
			ready := len(ds.Status.Conditions) == 1 && ds.Status.Conditions[0].Status == corev1.ConditionTrue
			return p != nil && p.Name == name && p.Namespace == ns && ready && ds.Labels[cdiv1.LabelDefaultPreference] == "fedora",
				fmt.Sprintf("source %+v labels %v status %+v", ds.Spec.Source, ds.Labels, ds.Status), nil
		})
		// Distinct last-use times for the garbage collector.
		time.Sleep(20 * time.Millisecond)
	}
	// Four imports, importsToKeep 3 (the default): the oldest DataVolume went.
	want := slices.Clone(names[1:])
	slices.Sort(want)
	kit.Eventually(t, 30*time.Second, 100*time.Millisecond, "three imports kept", func() (bool, string, error) {
		got := listDVNames(t, ns)
		claims := &corev1.PersistentVolumeClaimList{}
		if err := k8sClient.List(ctx, claims, client.InNamespace(ns)); err != nil {
			return false, "", err
		}
		var used []string
		for _, c := range claims.Items {
			used = append(used, c.Name+"@"+c.Annotations[cdiv1.AnnLastUseTime])
		}
		return slices.Equal(got, want), fmt.Sprintf("DataVolumes %v, want %v; claims last used %v", got, want, used), nil
	})
	// The poller recording the same digest again changes nothing.
	if got := poll(t, cron); got != digests[3] {
		t.Fatalf("poll read %s", got)
	}
	time.Sleep(500 * time.Millisecond)
	if got := listDVNames(t, ns); !slices.Equal(got, want) {
		t.Errorf("after a poll with no new digest: DataVolumes %v, want %v", got, want)
	}
}

// TestDataImportCronRetentionNoneAndGarbageCollectNever: garbageCollect
// Never keeps every import; retentionPolicy None labels what the cron makes
// and deleting the cron deletes it, and the poller's CronJob and Jobs.
func TestDataImportCronRetentionNoneAndGarbageCollectNever(t *testing.T) {
	ctx := context.Background()
	installNS, ns := newNamespace(t), newNamespace(t)
	reg := registry.Start(t, registry.Options{})
	startCronController(t, installNS)
	url := reg.URL("os/centos:9")
	reg.PushDisk(t, "os/centos:9", []byte("one"))
	cron := registryCron(ns, "centos", url, func(c *cdiv1.DataImportCron) {
		c.Spec.ManagedDataSource = "centos-stream9"
		c.Spec.RetentionPolicy = ptr.To(cdiv1.DataImportCronRetainNone)
		c.Spec.GarbageCollect = ptr.To(cdiv1.DataImportCronGarbageCollectNever)
		c.Spec.ImportsToKeep = ptr.To[int32](1)
	})
	createCron(t, cron)
	var names []string
	for i := 0; i < 3; i++ {
		if i > 0 {
			reg.PushDisk(t, "os/centos:9", []byte(fmt.Sprintf("disk %d", i)))
		}
		d := poll(t, cron)
		name := "centos-stream9-" + strings.TrimPrefix(d, "sha256:")[:12]
		names = append(names, name)
		dv := waitDV(t, ns, name)
		if dv.Labels[cdiv1.LabelDataImportCronCleanup] != "true" {
			t.Errorf("import %d labels %v: no cleanup label", i, dv.Labels)
		}
		succeed(t, dv)
		waitCron(t, ns, cron.Name, "UpToDate", func(c *cdiv1.DataImportCron) bool {
			return cronCondition(c, cdiv1.DataImportCronUpToDate) == "True/UpToDate" && c.Status.LastImportedPVC.Name == name
		})
		time.Sleep(20 * time.Millisecond)
	}
	slices.Sort(names)
	if got := listDVNames(t, ns); !slices.Equal(got, names) {
		t.Errorf("garbageCollect Never: DataVolumes %v, want all of %v", got, names)
	}
	ds := &cdiv1.DataSource{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "centos-stream9"}, ds); err != nil {
		t.Fatal(err)
	}
	if ds.Labels[cdiv1.LabelDataImportCronCleanup] != "true" {
		t.Errorf("DataSource labels %v: no cleanup label", ds.Labels)
	}
	// Something the cron did not make survives it.
	mine := kit.DataVolume(ns, "mine", kit.Blank(), kit.WithStorage("", "64Mi"))
	if err := k8sClient.Create(ctx, mine); err != nil {
		t.Fatal(err)
	}

	if err := k8sClient.Delete(ctx, cron); err != nil {
		t.Fatal(err)
	}
	kit.Eventually(t, 30*time.Second, 100*time.Millisecond, "the cron's imports, DataSource, CronJob and Job to go", func() (bool, string, error) {
		dvs := listDVNames(t, ns)
		err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: "centos-stream9"}, &cdiv1.DataSource{})
		cjs := &batchv1.CronJobList{}
		jobs := &batchv1.JobList{}
		if err := k8sClient.List(ctx, cjs, client.InNamespace(installNS), client.MatchingLabels{cdiv1.LabelDataImportCronNs: ns}); err != nil {
			return false, "", err
		}
		if err := k8sClient.List(ctx, jobs, client.InNamespace(installNS), client.MatchingLabels{cdiv1.LabelDataImportCronNs: ns}); err != nil {
			return false, "", err
		}
		live := 0
		for _, j := range jobs.Items {
			if j.DeletionTimestamp == nil {
				live++
			}
		}
		_, _, series := outdatedSeries(t, ns, "centos")
		return slices.Equal(dvs, []string{"mine"}) && apierrors.IsNotFound(err) && len(cjs.Items) == 0 && live == 0 && !series,
			fmt.Sprintf("DataVolumes %v, DataSource %v, CronJobs %d, Jobs %d, gauge series left %v", dvs, err, len(cjs.Items), live, series), nil
	})
}

// TestDataImportCronLeavesOthersDataSources: a DataSource of that name
// without the cron's label is not touched; one another cron manages gets
// the ErrDataSourceAlreadyManaged event and no import.
func TestDataImportCronLeavesOthersDataSources(t *testing.T) {
	ctx := context.Background()
	installNS, ns := newNamespace(t), newNamespace(t)
	reg := registry.Start(t, registry.Options{})
	startCronController(t, installNS)
	reg.PushDisk(t, "os/x:1", []byte("x"))
	ds := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "fedora"},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: "hand-made"}}}}
	if err := k8sClient.Create(ctx, ds); err != nil {
		t.Fatal(err)
	}
	cron := registryCron(ns, "first", reg.URL("os/x:1"))
	createCron(t, cron)
	d := poll(t, cron)
	dv := waitDV(t, ns, "fedora-"+strings.TrimPrefix(d, "sha256:")[:12])
	succeed(t, dv)
	waitCron(t, ns, cron.Name, "UpToDate", func(c *cdiv1.DataImportCron) bool {
		return cronCondition(c, cdiv1.DataImportCronUpToDate) == "True/UpToDate"
	})
	time.Sleep(300 * time.Millisecond)
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds); err != nil {
		t.Fatal(err)
	}
	if ds.Spec.Source.PVC.Name != "hand-made" || ds.Labels[cdiv1.LabelDataImportCron] != "" {
		t.Fatalf("an unlabelled DataSource was changed: labels %v source %+v", ds.Labels, ds.Spec.Source)
	}

	// Labelled for "first": a second cron naming it is refused.
	ds.Labels = map[string]string{cdiv1.LabelDataImportCron: "first"}
	if err := k8sClient.Update(ctx, ds); err != nil {
		t.Fatal(err)
	}
	second := registryCron(ns, "second", reg.URL("os/x:1"))
	createCron(t, second)
	kit.Eventually(t, 30*time.Second, 200*time.Millisecond, "ErrDataSourceAlreadyManaged on the second cron", func() (bool, string, error) {
		ev := kit.Events(k8sClient, ns, "second")
		return strings.Contains(ev, controller.ErrDataSourceAlreadyManaged) && strings.Contains(ev, "DataSource fedora is already managed by DataImportCron first"), ev, nil
	})
	if s := getCron(t, ns, "second"); len(s.Status.Conditions) != 0 {
		t.Errorf("the refused cron has status %+v", s.Status)
	}
}

// TestDataImportCronPVCSource: a pvc source is polled by the controller on
// the schedule; its digest is uid:<claim UID>.
func TestDataImportCronPVCSource(t *testing.T) {
	ctx := context.Background()
	installNS, ns := newNamespace(t), newNamespace(t)
	startCronController(t, installNS)
	// The cron clones as its namespace's default ServiceAccount, which must
	// be allowed to, even within one namespace.
	grantCloneSource(t, k8sClient, ns, ns, cdiv1.DefaultDataImportCronServiceAccount)
	src := kit.PVC(ns, "golden-src", "64Mi")
	if err := k8sClient.Create(ctx, src); err != nil {
		t.Fatal(err)
	}
	cron := &cdiv1.DataImportCron{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "from-pvc"},
		Spec: cdiv1.DataImportCronSpec{
			Schedule: "0 */12 * * *", ManagedDataSource: "golden",
			Template: cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{
				Source:  &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: "golden-src"}},
				Storage: &cdiv1.StorageSpec{},
			}},
		},
	}
	createCron(t, cron)
	c := waitCron(t, ns, cron.Name, "the uid digest", func(c *cdiv1.DataImportCron) bool {
		return c.Annotations[cdiv1.AnnSourceDesiredDigest] == "uid:"+string(src.UID) && c.Annotations[cdiv1.AnnNextCronTime] != ""
	})
	next, err := time.Parse(time.RFC3339, c.Annotations[cdiv1.AnnNextCronTime])
	if err != nil || !next.After(time.Now()) || next.Minute() != 0 || next.Hour()%12 != 0 {
		t.Errorf("nextCronTime %s (%v): want the next 0 */12 time", c.Annotations[cdiv1.AnnNextCronTime], err)
	}
	dv := waitDV(t, ns, "golden-"+string(src.UID)[:12])
	if dv.Spec.Source.PVC == nil || dv.Spec.Source.PVC.Name != "golden-src" {
		t.Errorf("import source %+v", dv.Spec.Source)
	}
	cjs := &batchv1.CronJobList{}
	if err := k8sClient.List(ctx, cjs, client.InNamespace(installNS), client.MatchingLabels{cdiv1.LabelDataImportCronNs: ns}); err != nil || len(cjs.Items) != 0 {
		t.Errorf("a pvc source got %d CronJobs (%v)", len(cjs.Items), err)
	}
}

// createCron creates a cron and deletes it when the test ends, while its
// controller still runs: the control plane outlives the test's namespaces,
// and a later test's controller would otherwise poll it too.
func createCron(t *testing.T, cron *cdiv1.DataImportCron) {
	t.Helper()
	if err := k8sClient.Create(context.Background(), cron); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), cron) })
}

// TestDataImportCronReplacesAFailedImport: an import whose DataVolume
// failed (Running False, reason Error) is deleted when a new digest
// arrives, and the new digest is imported.
func TestDataImportCronReplacesAFailedImport(t *testing.T) {
	ctx := context.Background()
	installNS, ns := newNamespace(t), newNamespace(t)
	reg := registry.Start(t, registry.Options{})
	startCronController(t, installNS)
	reg.PushDisk(t, "os/broken:1", []byte("a disk the importer fails on"))
	cron := registryCron(ns, "broken", reg.URL("os/broken:1"))
	createCron(t, cron)
	first := "fedora-" + strings.TrimPrefix(poll(t, cron), "sha256:")[:12]
	dv := waitDV(t, ns, first)
	dv.Status.Phase = cdiv1.ImportInProgress
	dv.Status.Conditions = []cdiv1.DataVolumeCondition{{Type: cdiv1.DataVolumeRunning,
		Status: corev1.ConditionFalse, Reason: cdiv1.ReasonError, Message: "Unable to process data"}}
	if err := k8sClient.Status().Update(ctx, dv); err != nil {
		t.Fatal(err)
	}
	waitCron(t, ns, cron.Name, "Progressing to show the DataVolume's phase", func(c *cdiv1.DataImportCron) bool {
		return cronCondition(c, cdiv1.DataImportCronProgressing) == "True/ImportProgressing"
	})
	reg.PushDisk(t, "os/broken:1", []byte("a fixed disk"))
	second := "fedora-" + strings.TrimPrefix(poll(t, cron), "sha256:")[:12]
	waitDV(t, ns, second)
	kit.Eventually(t, 30*time.Second, 100*time.Millisecond, "the failed import to be deleted", func() (bool, string, error) {
		got := listDVNames(t, ns)
		return slices.Equal(got, []string{second}), fmt.Sprintf("DataVolumes %v", got), nil
	})
	c := waitCron(t, ns, cron.Name, "the new import to be current", func(c *cdiv1.DataImportCron) bool {
		return len(c.Status.CurrentImports) == 1 && c.Status.CurrentImports[0].DataVolumeName == second
	})
	if c.Status.LastImportedPVC != nil {
		t.Errorf("lastImportedPVC %+v: nothing succeeded", c.Status.LastImportedPVC)
	}
}
