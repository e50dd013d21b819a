package controller

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func TestImportName(t *testing.T) {
	for _, tc := range []struct {
		ds, digest, want, err string
	}{
		{"fedora", "sha256:0123456789abcdef0123456789abcdef", "fedora-0123456789ab", ""},
		{"centos-stream9", "uid:6f1c2a3e-8b7d-4c2e-9f00-123456789abc", "centos-stream9-6f1c2a3e-8b7", ""},
		{"fedora", "md5:0123456789abcdef", "", "no supported prefix"},
		{"fedora", "sha256:0123", "", "too short"},
		{"fedora", "", "", "no supported prefix"},
	} {
		got, err := ImportName(tc.ds, tc.digest)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s %s: error %v, want %q", tc.ds, tc.digest, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s %s: %q (%v), want %q", tc.ds, tc.digest, got, err, tc.want)
		}
	}
}

func TestCronJobNames(t *testing.T) {
	cron := func(name string) *cdiv1.DataImportCron {
		return &cdiv1.DataImportCron{ObjectMeta: metav1.ObjectMeta{Name: name, UID: "0a1b2c3d-4e5f-6789-abcd-ef0123456789"}}
	}
	if got := CronJobName(cron("fedora-image-cron")); got != "fedora-image-cron-0a1b2c3d" {
		t.Errorf("CronJob name %q, want fedora-image-cron-0a1b2c3d", got)
	}
	if got := InitialJobName(cron("fedora-image-cron")); got != "initial-job-fedora-image-cron-0a1b2c3d" {
		t.Errorf("initial Job name %q, want initial-job-fedora-image-cron-0a1b2c3d", got)
	}
	// A 63-character cron name (the longest DNS-1035 label) still gives a
	// CronJob name the API server takes (52) and a Job name a label can hold.
	long := strings.Repeat("a", 40) + "-" + strings.Repeat("b", 22)
	long2 := strings.Repeat("a", 40) + "-" + strings.Repeat("c", 22)
	a, b := CronJobName(cron(long)), CronJobName(cron(long2))
	if len(a) > 52 || len(b) > 52 || a == b {
		t.Errorf("long names: %q (%d) and %q (%d): want distinct, at most 52", a, len(a), b, len(b))
	}
	if !strings.HasSuffix(a, "-0a1b2c3d") {
		t.Errorf("shortened CronJob name %q lost the UID suffix", a)
	}
	for _, n := range []string{a, InitialJobName(cron(long))} {
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			t.Errorf("%q: %v", n, errs)
		}
	}
	if j := InitialJobName(cron(long)); len(j) > 63 {
		t.Errorf("initial Job name %q is %d characters", j, len(j))
	}
}

func TestDigestedURL(t *testing.T) {
	const d = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
	for _, tc := range []struct{ url, want string }{
		{"docker://quay.io/containerdisks/fedora:40", "docker://quay.io/containerdisks/fedora@" + d},
		{"docker://quay.io/containerdisks/fedora", "docker://quay.io/containerdisks/fedora@" + d},
		{"docker://10.0.0.1:5000/os/centos:stream9", "docker://10.0.0.1:5000/os/centos@" + d},
		{"docker://10.0.0.1:5000/os/centos", "docker://10.0.0.1:5000/os/centos@" + d},
		// CDI #2689: a pinned URL is not pinned twice.
		{"docker://quay.io/containerdisks/fedora@sha256:2222222222222222222222222222222222222222222222222222222222222222", "docker://quay.io/containerdisks/fedora@" + d},
		{"docker://quay.io/containerdisks/fedora:40@" + d, "docker://quay.io/containerdisks/fedora@" + d},
		{"docker://fedora:latest", "docker://fedora@" + d},
	} {
		if got := DigestedURL(tc.url, d); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.url, got, tc.want)
		}
	}
}

func TestImportsToKeepAndGarbageCollect(t *testing.T) {
	c := &cdiv1.DataImportCron{}
	if ImportsToKeep(c) != 3 || !CollectsGarbage(c) {
		t.Errorf("defaults: keep %d, gc %v; want 3, true", ImportsToKeep(c), CollectsGarbage(c))
	}
	c.Spec.ImportsToKeep = ptr.To[int32](0)
	c.Spec.GarbageCollect = ptr.To(cdiv1.DataImportCronGarbageCollectNever)
	if ImportsToKeep(c) != 0 || CollectsGarbage(c) {
		t.Errorf("keep 0, Never: keep %d, gc %v", ImportsToKeep(c), CollectsGarbage(c))
	}
	c.Spec.ImportsToKeep = ptr.To[int32](-1)
	if ImportsToKeep(c) != 3 {
		t.Errorf("negative: keep %d, want the default", ImportsToKeep(c))
	}
}

func TestOutdated(t *testing.T) {
	claim := func(name, used string) *corev1.PersistentVolumeClaim {
		c := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if used != "" {
			c.Annotations = map[string]string{cdiv1.AnnLastUseTime: used}
		}
		return c
	}
	items := []*corev1.PersistentVolumeClaim{
		claim("a", "2026-12-01T10:00:05Z"),
		// RFC3339Nano drops zeros: as strings "…05Z" sorts after "…05.5Z".
		claim("b", "2026-12-01T10:00:05.5Z"),
		claim("c", "2026-12-01T09:00:00Z"),
		claim("d", ""),
		claim("e", "2026-12-01T11:00:00.123456789Z"),
	}
	names := func(cs []*corev1.PersistentVolumeClaim) string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Name)
		}
		return strings.Join(out, ",")
	}
	for _, tc := range []struct {
		keep int
		want string
	}{{3, "c,d"}, {2, "a,c,d"}, {1, "b,a,c,d"}, {5, ""}, {9, ""}, {0, "e,b,a,c,d"}} {
		if got := names(Outdated(items, tc.keep)); got != tc.want {
			t.Errorf("keep %d: remove %q, want %q", tc.keep, got, tc.want)
		}
	}
}

func TestEffectiveStorageClass(t *testing.T) {
	sc := func(name string, ann string, age int) storagev1.StorageClass {
		c := storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Unix(int64(1000+age), 0))}}
		if ann != "" {
			c.Annotations = map[string]string{ann: "true"}
		}
		return c
	}
	classes := []storagev1.StorageClass{sc("plain", "", 0), sc("k8s-default", cdiv1.AnnDefaultStorageClass, 1), sc("virt-default", cdiv1.AnnDefaultVirtStorageClass, 2)}
	tmpl := func(pvc, st *string) *cdiv1.DataVolume {
		dv := &cdiv1.DataVolume{}
		if pvc != nil {
			dv.Spec.PVC = &corev1.PersistentVolumeClaimSpec{StorageClassName: pvc}
		}
		if st != nil {
			dv.Spec.Storage = &cdiv1.StorageSpec{StorageClassName: st}
		}
		return dv
	}
	for _, tc := range []struct {
		name    string
		dv      *cdiv1.DataVolume
		classes []storagev1.StorageClass
		want    string
	}{
		{"template's storage", tmpl(nil, ptr.To("plain")), classes, "plain"},
		{"template's pvc", tmpl(ptr.To("plain"), nil), classes, "plain"},
		{"virt default", tmpl(nil, nil), classes, "virt-default"},
		{"k8s default", tmpl(nil, nil), classes[:2], "k8s-default"},
		{"none", tmpl(nil, nil), classes[:1], ""},
		{"empty name falls back", tmpl(nil, ptr.To("")), classes, "virt-default"},
	} {
		if got := EffectiveStorageClass(tc.dv, tc.classes); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestCronConditions(t *testing.T) {
	pvc, snap := cdiv1.DataImportCronSourceFormatPvc, cdiv1.DataImportCronSourceFormatSnapshot
	for _, tc := range []struct {
		name              string
		s                 importState
		progress, upToDte string // status/reason
		keep              bool   // UpToDate left as it is
	}{
		{"nothing yet", importState{Format: pvc}, "False/NoImport", "False/NoDigest", false},
		{"digest, no import yet", importState{DigestUpdated: true, Format: pvc}, "False/NoImport", "False/Outdated", false},
		{"scheduled", importState{DVPhase: cdiv1.ImportScheduled, Importing: true, Format: pvc}, "False/ImportScheduled", "False/ImportProgressing", false},
		{"in progress", importState{DVPhase: cdiv1.ImportInProgress, Importing: true, Format: pvc}, "True/ImportProgressing", "False/ImportProgressing", false},
		{"pending", importState{DVPhase: cdiv1.Pending, Importing: true, Format: pvc}, "False/Pending", "False/ImportProgressing", false},
		{"succeeded", importState{DVPhase: cdiv1.Succeeded, Succeeded: true, Importing: true, Format: pvc}, "False/NoImport", "True/UpToDate", false},
		{"succeeded, new digest", importState{DVPhase: cdiv1.Succeeded, Succeeded: true, Importing: true, DigestUpdated: true, Format: pvc}, "False/NoImport", "False/Outdated", false},
		{"snapshot not made", importState{DVPhase: cdiv1.Succeeded, Succeeded: true, Importing: true, Format: snap}, "False/NoImport", "", true},
		{"snapshot not ready", importState{Succeeded: true, Importing: true, Format: snap, Snapshot: true}, "False/NoImport", "False/ImportProgressing", false},
		{"snapshot ready", importState{Succeeded: true, Importing: true, Format: snap, Snapshot: true, SnapshotReady: true}, "False/NoImport", "True/UpToDate", false},
	} {
		p := progressingCondition(tc.s)
		if got := string(p.Status) + "/" + p.Reason; got != tc.progress {
			t.Errorf("%s: Progressing %s, want %s", tc.name, got, tc.progress)
		}
		u, ok := upToDateCondition(tc.s)
		if ok == tc.keep {
			t.Errorf("%s: UpToDate written %v, want %v", tc.name, ok, !tc.keep)
			continue
		}
		if got := string(u.Status) + "/" + u.Reason; ok && got != tc.upToDte {
			t.Errorf("%s: UpToDate %s, want %s", tc.name, got, tc.upToDte)
		}
	}
}

func TestSetCronCondition(t *testing.T) {
	cron := &cdiv1.DataImportCron{}
	t1, t2, t3 := metav1.NewTime(time.Unix(100, 0)), metav1.NewTime(time.Unix(200, 0)), metav1.NewTime(time.Unix(300, 0))
	setCronCondition(cron, cdiv1.DataImportCronUpToDate, cronCondition{corev1.ConditionFalse, ReasonNoDigest, "No source digest"}, t1)
	setCronCondition(cron, cdiv1.DataImportCronUpToDate, cronCondition{corev1.ConditionFalse, ReasonOutdated, "Source digest updated since last import"}, t2)
	c := findCronCondition(cron, cdiv1.DataImportCronUpToDate)
	if c == nil || !c.LastTransitionTime.Equal(&t1) || !c.LastHeartbeatTime.Equal(&t2) || c.Reason != ReasonOutdated {
		t.Fatalf("after a reason change: %+v", c)
	}
	setCronCondition(cron, cdiv1.DataImportCronUpToDate, cronCondition{corev1.ConditionTrue, ReasonUpToDate, "Latest import is up to date"}, t3)
	if c = findCronCondition(cron, cdiv1.DataImportCronUpToDate); !c.LastTransitionTime.Equal(&t3) || len(cron.Status.Conditions) != 1 {
		t.Fatalf("after a status change: %+v", cron.Status.Conditions)
	}
}

func TestImportDataVolume(t *testing.T) {
	url := "docker://quay.io/containerdisks/fedora:40"
	cron := &cdiv1.DataImportCron{
		ObjectMeta: metav1.ObjectMeta{Name: "fedora-cron", Namespace: "os-images",
			Labels:      map[string]string{cdiv1.LabelDefaultPreference: "fedora", "unrelated": "x"},
			Annotations: map[string]string{cdiv1.AnnPodRetainAfterCompletion: "true"}},
		Spec: cdiv1.DataImportCronSpec{
			ManagedDataSource: "fedora",
			RetentionPolicy:   ptr.To(cdiv1.DataImportCronRetainNone),
			Template: cdiv1.DataVolume{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"mine": "y"}},
				Spec: cdiv1.DataVolumeSpec{
					Source:  &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: &url}},
					Storage: &cdiv1.StorageSpec{},
				},
			},
		},
	}
	const d = "sha256:abcdefabcdef0000000000000000000000000000000000000000000000000000"
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	dv := ImportDataVolume(cron, "fedora-abcdefabcdef", d, now)
	if dv.Name != "fedora-abcdefabcdef" || dv.Namespace != "os-images" {
		t.Errorf("name %s/%s", dv.Namespace, dv.Name)
	}
	if got := *dv.Spec.Source.Registry.URL; got != "docker://quay.io/containerdisks/fedora@"+d {
		t.Errorf("URL %s", got)
	}
	if *cron.Spec.Template.Spec.Source.Registry.URL != url {
		t.Error("the template was changed")
	}
	for k, v := range map[string]string{cdiv1.LabelDataImportCron: "fedora-cron", cdiv1.LabelDataImportCronCleanup: "true",
		cdiv1.LabelDefaultPreference: "fedora", "mine": "y"} {
		if dv.Labels[k] != v {
			t.Errorf("label %s=%q, want %q", k, dv.Labels[k], v)
		}
	}
	if _, ok := dv.Labels["unrelated"]; ok {
		t.Error("a cron label not on CDI's list was copied")
	}
	for k, v := range map[string]string{cdiv1.AnnImmediateBinding: "true", cdiv1.AnnLastUseTime: "2026-12-01T10:00:00Z", cdiv1.AnnPodRetainAfterCompletion: "true"} {
		if dv.Annotations[k] != v {
			t.Errorf("annotation %s=%q, want %q", k, dv.Annotations[k], v)
		}
	}
}
