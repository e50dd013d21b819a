package nodeagent

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestExpandVars(t *testing.T) {
	vals := map[string]string{"A": "1", "B": "two"}
	lookup := func(k string) (string, bool) { v, ok := vals[k]; return v, ok }
	for _, tc := range []struct{ in, want string }{
		{"plain", "plain"},
		{"$(A)", "1"},
		{"x$(A)y$(B)z", "x1ytwoz"},
		{"$$(A)", "$(A)"},
		{"$(MISSING)", "$(MISSING)"},
		{"$(A", "$(A"},
		{"cost $5", "cost $5"},
		{"end$", "end$"},
	} {
		if got := expandVars(tc.in, lookup); got != tc.want {
			t.Errorf("expandVars(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestImageResolve(t *testing.T) {
	tbl := ImageTable{KubefillBinary: "/cache/kubefill"}
	for _, tc := range []struct {
		ref      string
		ok       bool
		kubefill bool
	}{
		{"kubefill/kubefill:dev", true, true},
		{"quay.io/kubefill/kubefill-importer@sha256:abc", true, true},
		{"localhost:5000/kubefill:latest", true, true},
		{"busybox", true, false},
		{"docker.io/library/busybox:1.36", true, false},
		{"registry.k8s.io/e2e-test-images/busybox:1.36.1-1", true, false},
		{"nginx", false, false},
		{"quay.io/kubevirt/cdi-importer:v1.60.0", false, false},
	} {
		img, ok := tbl.Resolve(tc.ref)
		if ok != tc.ok {
			t.Errorf("Resolve(%q) ok = %v, want %v", tc.ref, ok, tc.ok)
			continue
		}
		if got := img.Binaries["kubefill"] == "/cache/kubefill"; got != tc.kubefill {
			t.Errorf("Resolve(%q) kubefill = %v, want %v", tc.ref, got, tc.kubefill)
		}
	}
	if _, ok := (ImageTable{}).Resolve("kubefill/kubefill"); ok {
		t.Error("kubefill image resolved without a kubefill binary")
	}
}

func TestPodPhase(t *testing.T) {
	run := ctrView{started: true, running: true}
	ok := ctrView{started: true, terminated: true}
	bad := ctrView{started: true, terminated: true, exitCode: 3}
	restarting := ctrView{started: true, terminated: true, exitCode: 3, willRestart: true}
	for _, tc := range []struct {
		name     string
		initDone bool
		ctrs     []ctrView
		want     corev1.PodPhase
	}{
		{"init running", false, []ctrView{{}}, corev1.PodPending},
		{"not started", true, []ctrView{run, {}}, corev1.PodPending},
		{"running", true, []ctrView{run}, corev1.PodRunning},
		{"one done one running", true, []ctrView{ok, run}, corev1.PodRunning},
		{"all ok", true, []ctrView{ok, ok}, corev1.PodSucceeded},
		{"one failed", true, []ctrView{ok, bad}, corev1.PodFailed},
		{"failed but restarting", true, []ctrView{restarting}, corev1.PodRunning},
	} {
		if got := podPhase(tc.initDone, tc.ctrs); got != tc.want {
			t.Errorf("%s: phase = %s, want %s", tc.name, got, tc.want)
		}
	}
}

func TestRestarts(t *testing.T) {
	for _, tc := range []struct {
		policy corev1.RestartPolicy
		code   int32
		init   bool
		want   bool
	}{
		{corev1.RestartPolicyNever, 1, false, false},
		{corev1.RestartPolicyOnFailure, 0, false, false},
		{corev1.RestartPolicyOnFailure, 2, false, true},
		{corev1.RestartPolicyAlways, 0, false, true},
		{corev1.RestartPolicyAlways, 0, true, false},
		{corev1.RestartPolicyAlways, 1, true, true},
	} {
		if got := restarts(tc.policy, tc.code, tc.init); got != tc.want {
			t.Errorf("restarts(%s, %d, init=%v) = %v, want %v", tc.policy, tc.code, tc.init, got, tc.want)
		}
	}
}

type fakeObjects struct {
	cms     map[string]*corev1.ConfigMap
	secrets map[string]*corev1.Secret
}

func (f fakeObjects) configMap(ns, name string) (*corev1.ConfigMap, error) {
	if cm, ok := f.cms[name]; ok {
		return cm, nil
	}
	return nil, notFound("configmaps", name)
}

func (f fakeObjects) secret(ns, name string) (*corev1.Secret, error) {
	if s, ok := f.secrets[name]; ok {
		return s, nil
	}
	return nil, notFound("secrets", name)
}

func TestContainerEnv(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u-1", Labels: map[string]string{"app": "x"}},
		Spec:       corev1.PodSpec{NodeName: "n1"},
		Status:     corev1.PodStatus{PodIP: "10.244.1.2"},
	}
	optional := true
	c := &corev1.Container{
		Name: "c",
		EnvFrom: []corev1.EnvFromSource{
			{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}, Prefix: "CM_"},
		},
		Env: []corev1.EnvVar{
			{Name: "PLAIN", Value: "v"},
			{Name: "REF", Value: "$(PLAIN)-$(CM_k)"},
			{Name: "NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
			{Name: "IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
			{Name: "PASS", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "password"}}},
			{Name: "OPT", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "k", Optional: &optional}}},
			{Name: "MEM", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
		},
		Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}},
	}
	get := fakeObjects{
		cms:     map[string]*corev1.ConfigMap{"cm": {Data: map[string]string{"k": "fromcm"}}},
		secrets: map[string]*corev1.Secret{"s": {Data: map[string][]byte{"password": []byte("hunter2")}}},
	}
	env, err := containerEnv(pod, c, get)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"CM_k=fromcm", "PLAIN=v", "REF=v-fromcm", "NAME=p", "APP=x", "IP=10.244.1.2", "PASS=hunter2", "MEM=64"}
	if !reflect.DeepEqual(env, want) {
		t.Fatalf("env = %q\nwant  %q", env, want)
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: "MISSING", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}, Key: "absent"}}})
	if _, err := containerEnv(pod, c, get); err == nil {
		t.Fatal("a missing non-optional key gave no error")
	}
}

func TestCommandLine(t *testing.T) {
	img := Image{Entrypoint: []string{"/.image/bin/kubefill"}, Cmd: []string{"--help"}}
	env := []string{"X=42"}
	for _, tc := range []struct {
		name string
		c    corev1.Container
		want []string
	}{
		{"image defaults", corev1.Container{}, []string{"/.image/bin/kubefill", "--help"}},
		{"args only", corev1.Container{Args: []string{"importer", "--n=$(X)"}}, []string{"/.image/bin/kubefill", "importer", "--n=42"}},
		{"command", corev1.Container{Command: []string{"sh", "-c"}, Args: []string{"echo $(X)"}}, []string{"sh", "-c", "echo 42"}},
	} {
		got, err := commandLine(&tc.c, img, env)
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: commandLine = %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
	if _, err := commandLine(&corev1.Container{Name: "x"}, Image{}, nil); err == nil {
		t.Error("no command and no entrypoint gave no error")
	}
}

func notFound(resource, name string) error {
	return apierrors.NewNotFound(schema.GroupResource{Resource: resource}, name)
}

func TestContainerIdentity(t *testing.T) {
	i64 := func(v int64) *int64 { return &v }
	yes := true
	for _, tc := range []struct {
		name    string
		pod     *corev1.PodSecurityContext
		ctr     *corev1.SecurityContext
		want    identity
		wantErr bool
	}{
		{name: "none", want: identity{}},
		{name: "pod user and groups", pod: &corev1.PodSecurityContext{RunAsUser: i64(107), RunAsGroup: i64(107), FSGroup: i64(107), SupplementalGroups: []int64{5, 107}},
			want: identity{UID: 107, GID: 107, Groups: []uint32{5, 107}}},
		{name: "container wins", pod: &corev1.PodSecurityContext{RunAsUser: i64(1)}, ctr: &corev1.SecurityContext{RunAsUser: i64(2), RunAsGroup: i64(3)},
			want: identity{UID: 2, GID: 3}},
		{name: "non-root without user", pod: &corev1.PodSecurityContext{RunAsNonRoot: &yes}, wantErr: true},
		{name: "non-root with user", ctr: &corev1.SecurityContext{RunAsNonRoot: &yes, RunAsUser: i64(1000)}, want: identity{UID: 1000}},
	} {
		pod := &corev1.Pod{Spec: corev1.PodSpec{SecurityContext: tc.pod}}
		got, err := containerIdentity(pod, &corev1.Container{SecurityContext: tc.ctr})
		if (err != nil) != tc.wantErr {
			t.Errorf("%s: err = %v, wantErr %v", tc.name, err, tc.wantErr)
			continue
		}
		if !tc.wantErr && !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: identity = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
