package clone

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/cloner"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/pkg/token"
)

// The source pod's environment is pkg/cloner's, which the controller side
// does not import.
func TestSourcePodEnvironmentIsTheCloners(t *testing.T) {
	for ours, theirs := range map[string]string{
		envVolumeMode: cloner.EnvVolumeMode, envMountPoint: cloner.EnvMountPoint, envUploadURL: cloner.EnvUploadURL, envUploadServerName: cloner.EnvUploadServerName,
		envOwnerUID: cloner.EnvOwnerUID, envPreallocation: cloner.EnvPreallocation, envServerCACert: cloner.EnvServerCACert,
		envClientCert: cloner.EnvClientCert, envClientKey: cloner.EnvClientKey, sourceMountPoint: cloner.SourceMountPoint,
	} {
		if ours != theirs {
			t.Errorf("%q here, %q in pkg/cloner", ours, theirs)
		}
	}
	for _, mode := range []*corev1.PersistentVolumeMode{nil, ptr.To(corev1.PersistentVolumeFilesystem), ptr.To(corev1.PersistentVolumeBlock)} {
		v := volumeModeEnv(&corev1.PersistentVolumeClaim{Spec: corev1.PersistentVolumeClaimSpec{VolumeMode: mode}})
		if _, err := cloner.ParseMode(v); err != nil {
			t.Errorf("VOLUME_MODE %q: %v", v, err)
		}
	}
}

func TestNames(t *testing.T) {
	if got := TmpClaimName("u1"); got != "tmp-pvc-u1" {
		t.Error(got)
	}
	if got := TmpSnapshotName("u1"); got != "tmp-snapshot-u1" {
		t.Error(got)
	}
	if got := SourcePodName("u1"); got != "u1-source-pod" {
		t.Error(got)
	}
	if got := UploadClientName("golden", "src", "golden", "tmp-pvc-u1"); got != "golden/src-golden/tmp-pvc-u1" {
		t.Error(got)
	}
	if got := UploadURL("10.244.1.7"); got != "https://10.244.1.7:443/v1beta1/upload" {
		t.Error(got)
	}
	if got := UploadURL("fd00::7"); got != "https://[fd00::7]:443/v1beta1/upload" {
		t.Error(got)
	}
	if got := UploadServerName("cdi-upload-tmp-pvc-u1", "golden"); got != "cdi-upload-tmp-pvc-u1.golden.svc" {
		t.Error(got)
	}
}

func pod(name string, phase corev1.PodPhase, labels map[string]string, claim string, readOnlyVolume, readOnlyMount bool) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "golden", Name: name, Labels: labels},
		Spec: corev1.PodSpec{
			Volumes:    []corev1.Volume{{Name: "d", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim, ReadOnly: readOnlyVolume}}}},
			Containers: []corev1.Container{{Name: "c", VolumeMounts: []corev1.VolumeMount{{Name: "d", MountPath: "/d", ReadOnly: readOnlyMount}}}},
		},
		Status: corev1.PodStatus{Phase: phase},
	}
}

func TestPodUsingClaim(t *testing.T) {
	ours := map[string]string{cdiv1.LabelComponent: componentCloneSource}
	cases := []struct {
		name string
		pods []corev1.Pod
		want string
	}{
		{"no pods", nil, ""},
		{"a VM writing it", []corev1.Pod{pod("vm", corev1.PodRunning, nil, "src", false, false)}, "golden/vm"},
		{"another claim", []corev1.Pod{pod("vm", corev1.PodRunning, nil, "other", false, false)}, ""},
		{"read-only volume", []corev1.Pod{pod("reader", corev1.PodRunning, nil, "src", true, false)}, ""},
		{"read-only mounts", []corev1.Pod{pod("reader", corev1.PodRunning, nil, "src", false, true)}, ""},
		{"finished", []corev1.Pod{pod("job", corev1.PodSucceeded, nil, "src", false, false), pod("crash", corev1.PodFailed, nil, "src", false, false)}, ""},
		{"our clone source pod", []corev1.Pod{pod("u-source-pod", corev1.PodRunning, ours, "src", false, false)}, ""},
		{"pending pods count", []corev1.Pod{pod("ok", corev1.PodRunning, nil, "src", true, true), pod("vm", corev1.PodPending, nil, "src", false, false)}, "golden/vm"},
	}
	for _, c := range cases {
		if got := PodUsingClaim(c.pods, "src"); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

func TestTokenMismatch(t *testing.T) {
	target := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "vms", Name: "disk", UID: "u-1",
		Annotations: map[string]string{cdiv1.AnnDataSourceNamespace: "golden"}},
		Spec: corev1.PersistentVolumeClaimSpec{DataSourceRef: &corev1.TypedObjectReference{APIGroup: ptr.To(cdiv1.GroupName), Kind: cdiv1.VolumeCloneSourceRef, Name: "vcs"}}}
	pvc := &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "src"}
	snap := &corev1.TypedLocalObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "src"}
	good := func() *token.Payload { return token.NewClonePayload(token.ResourcePVC, "golden", "src", "vms", "disk") }
	with := func(edit func(p *token.Payload)) *token.Payload { p := good(); edit(p); return p }
	cases := []struct {
		name   string
		p      *token.Payload
		source *corev1.TypedLocalObjectReference
		want   string
	}{
		{"valid, before the source is read", good(), nil, ""},
		{"valid for the source", good(), pvc, ""},
		{"bound to this claim", with(func(p *token.Payload) { p.Params[token.ParamUID] = "u-1" }), pvc, ""},
		{"bound to another claim", with(func(p *token.Payload) { p.Params[token.ParamUID] = "u-2" }), nil, "issued for another target (UID u-2"},
		{"another target name", with(func(p *token.Payload) { p.Params[token.ParamTargetName] = "other" }), nil, "issued for another target (vms/other)"},
		{"another target namespace", with(func(p *token.Payload) { p.Params[token.ParamTargetNamespace] = "x" }), nil, "issued for another target (x/disk)"},
		{"another source namespace", with(func(p *token.Payload) { p.Namespace = "elsewhere" }), nil, `from namespace "elsewhere"`},
		{"an upload token", with(func(p *token.Payload) { p.Operation = token.OperationUpload }), nil, `allows "Upload"`},
		{"another source", with(func(p *token.Payload) { p.Name = "secret-disk" }), pvc, "issued for another source"},
		{"a claim's token for a snapshot", good(), snap, "issued for another source"},
	}
	for _, c := range cases {
		got := tokenMismatch(c.p, target, c.source, "clone token", func(f string, a ...any) string { return "refused: " + fmtS(f, a...) })
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

func TestPhaseAnnotations(t *testing.T) {
	k := &Kind{}
	target := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{cdiv1.AnnCloneError: "too small"}}}
	cases := []struct {
		name               string
		phase              string
		res                populators.Result
		clonePhase, reason string
		running            bool
	}{
		{"all done", "Rebind", populators.Result{Done: true}, "Succeeded", "Completed", false},
		{"refused", "Pending", populators.Result{Reason: reasonCloneError, Message: "too small"}, "Error", "Error", false},
		{"waiting for the source", "Pending", populators.Result{Reason: "CloneWithoutSource", Message: "x"}, "Pending", "", false},
		{"copying", "HostClone", populators.Result{Pod: &populators.PodStatus{Phase: corev1.PodRunning}}, "HostClone", "", false},
		{"expanding", "PrepClaim", populators.Result{}, "PrepClaim", "Populator is running", true},
		{"a base phase name", "worker", populators.Result{}, "", "", false},
	}
	for _, c := range cases {
		ann := k.PhaseAnnotations(target, c.phase, c.res)
		if ann[cdiv1.AnnClonePhase] != c.clonePhase || ann[cdiv1.AnnRunningConditionReason] != c.reason ||
			(ann[cdiv1.AnnRunningCondition] == "true") != c.running {
			t.Errorf("%s: %v", c.name, ann)
		}
	}
}

func fmtS(f string, a ...any) string { return fmt.Sprintf(f, a...) }

func TestSourceMapping(t *testing.T) {
	vcs := &cdiv1.VolumeCloneSource{ObjectMeta: metav1.ObjectMeta{Namespace: "src", Name: "volume-clone-source-x"},
		Spec: cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "golden"}}}
	if !NamesSource(vcs, "PersistentVolumeClaim", "golden") || NamesSource(vcs, "VolumeSnapshot", "golden") || NamesSource(vcs, "PersistentVolumeClaim", "other") {
		t.Error("NamesSource of a claim source")
	}
	if _, ok := DataVolumeOf(vcs); ok {
		t.Error("a bare VolumeCloneSource names no DataVolume")
	}
	vcs.Annotations = map[string]string{cdiv1.AnnOwnedByDataVolume: "tgt/disk"}
	if key, ok := DataVolumeOf(vcs); !ok || key.String() != "tgt/disk" {
		t.Errorf("cross-namespace: %v %v", key, ok)
	}
	vcs.Annotations = nil
	vcs.OwnerReferences = []metav1.OwnerReference{{Kind: "DataVolume", Name: "disk", Controller: ptr.To(true)}}
	if key, ok := DataVolumeOf(vcs); !ok || key.String() != "src/disk" {
		t.Errorf("same namespace: %v %v", key, ok)
	}
}

func TestClaimsOf(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "src", Name: "vm"}, Spec: corev1.PodSpec{Volumes: []corev1.Volume{
		{Name: "disk", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "golden"}}},
		{Name: "tmp", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	}}}
	got := ClaimsOf(pod)
	if len(got) != 1 || got[0].GetNamespace() != "src" || got[0].GetName() != "golden" {
		t.Errorf("ClaimsOf = %v", got)
	}
	if ClaimsOf(&corev1.PersistentVolumeClaim{}) != nil {
		t.Error("a claim mounts no claims")
	}
}

// On a claim only the extended token, bound to the claim's UID, counts: a
// short token (valid or not) is never accepted; a DataVolume's claim
// without the extended token yet waits for its DataVolume to add it, said
// as such; an expired or unbound extended token is final.
func TestCheckTokenOnClaims(t *testing.T) {
	key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	payload := token.NewClonePayload(token.ResourcePVC, "golden", "src", "vms", "disk")
	sign := func(issuer string, p *token.Payload, at time.Time) string {
		t.Helper()
		s, err := token.NewGeneratorAt(issuer, key, time.Minute, func() time.Time { return at }).Generate(p)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	now := time.Now()
	validShort := sign(token.CloneTokenIssuer, payload, now)
	k := &Kind{ExtendedTokens: token.NewValidator(token.ExtendedCloneTokenIssuer, &key.PublicKey, 0)}
	dv := metav1.OwnerReference{APIVersion: cdiv1.SchemeGroupVersion.String(), Kind: "DataVolume", Name: "disk", UID: "dv-1", Controller: ptr.To(true)}
	for _, c := range []struct {
		name   string
		ann    map[string]string
		owners []metav1.OwnerReference
		want   string
	}{
		{"bare claim, valid short token", map[string]string{cdiv1.AnnCloneToken: validShort}, nil, "is not accepted on a claim"},
		{"bare claim, no token", nil, nil, "ReferenceGrant"},
		{"DataVolume's claim before its extended token", map[string]string{cdiv1.AnnCloneToken: validShort}, []metav1.OwnerReference{dv}, "waiting for the extended clone token bound to this claim, which DataVolume disk adds"},
		{"a short token in the extended annotation", map[string]string{cdiv1.AnnExtendedCloneToken: validShort}, nil, "not valid"},
		{"extended, expired", map[string]string{cdiv1.AnnExtendedCloneToken: sign(token.ExtendedCloneTokenIssuer, token.WithUID(payload, "u-1"), now.Add(-time.Hour))}, nil, "has expired; create the clone again"},
		{"extended, bound to no claim", map[string]string{cdiv1.AnnExtendedCloneToken: sign(token.ExtendedCloneTokenIssuer, payload, now)}, nil, "bound to no claim"},
		{"extended, bound to another claim", map[string]string{cdiv1.AnnExtendedCloneToken: sign(token.ExtendedCloneTokenIssuer, token.WithUID(payload, "u-2"), now)}, nil, "UID u-2"},
		{"extended, bound to this claim", map[string]string{cdiv1.AnnExtendedCloneToken: sign(token.ExtendedCloneTokenIssuer, token.WithUID(payload, "u-1"), now)}, nil, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			ann := map[string]string{cdiv1.AnnDataSourceNamespace: "golden"}
			for k, v := range c.ann {
				ann[k] = v
			}
			target := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "vms", Name: "disk", UID: "u-1", OwnerReferences: c.owners, Annotations: ann},
				Spec: corev1.PersistentVolumeClaimSpec{DataSourceRef: &corev1.TypedObjectReference{APIGroup: ptr.To(cdiv1.GroupName), Kind: cdiv1.VolumeCloneSourceRef, Name: "vcs"}}}
			got, pending := k.checkToken(target, nil)
			if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
				t.Errorf("%q, want %q", got, c.want)
			}
			// Only the DataVolume's own claim waits quietly: every other
			// refusal is one the user must act on.
			if wantPending := c.owners != nil && c.ann[cdiv1.AnnExtendedCloneToken] == ""; pending != wantPending {
				t.Errorf("pending %v, want %v", pending, wantPending)
			}
		})
	}
}
