package controller

import (
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func storageClass(name string, isDefault bool, created time.Time) storagev1.StorageClass {
	sc := storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)}, Provisioner: LocalTestDriver}
	if isDefault {
		sc.Annotations = map[string]string{cdiv1.AnnDefaultStorageClass: "true"}
	}
	return sc
}

func TestValidPercent(t *testing.T) {
	for p, want := range map[cdiv1.Percent]bool{
		"0": true, "1": true, "0.06": true, "0.5": true, "0.055": true,
		"": false, "0.0555": false, "1.0": false, "2": false, "-0.1": false, ".5": false, "0.": false, "abc": false,
	} {
		if got := ValidPercent(p); got != want {
			t.Errorf("ValidPercent(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestFilesystemOverheadFor(t *testing.T) {
	classes := []string{"fast", "slow"}
	tests := []struct {
		name    string
		spec    *cdiv1.FilesystemOverhead
		want    *cdiv1.FilesystemOverhead
		wantErr string
	}{
		{
			name: "no spec: the default everywhere",
			want: &cdiv1.FilesystemOverhead{Global: "0.06", StorageClass: map[string]cdiv1.Percent{"fast": "0.06", "slow": "0.06"}},
		},
		{
			name: "global from spec applies to every class",
			spec: &cdiv1.FilesystemOverhead{Global: "0.1"},
			want: &cdiv1.FilesystemOverhead{Global: "0.1", StorageClass: map[string]cdiv1.Percent{"fast": "0.1", "slow": "0.1"}},
		},
		{
			name: "per class from spec, others the global default; entries for missing classes dropped",
			spec: &cdiv1.FilesystemOverhead{StorageClass: map[string]cdiv1.Percent{"slow": "0.2", "gone": "0.3"}},
			want: &cdiv1.FilesystemOverhead{Global: "0.06", StorageClass: map[string]cdiv1.Percent{"fast": "0.06", "slow": "0.2"}},
		},
		{
			name:    "invalid global is an error",
			spec:    &cdiv1.FilesystemOverhead{Global: "6%"},
			wantErr: `global "6%"`,
		},
		{
			name:    "invalid per-class value is an error naming the class",
			spec:    &cdiv1.FilesystemOverhead{StorageClass: map[string]cdiv1.Percent{"fast": "1.5"}},
			wantErr: `storageClass[fast] "1.5"`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := FilesystemOverheadFor(tt.spec, classes)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestScratchSpaceStorageClassFor(t *testing.T) {
	now := time.Now()
	name := func(s string) *string { return &s }
	plain := []storagev1.StorageClass{storageClass("a", false, now), storageClass("b", false, now)}
	withDefault := append(plain, storageClass("def", true, now))
	twoDefaults := append(withDefault, storageClass("newer-def", true, now.Add(time.Minute)))
	tests := []struct {
		name    string
		spec    *string
		classes []storagev1.StorageClass
		want    string
	}{
		{"nothing", nil, nil, ""},
		{"no default", nil, plain, ""},
		{"the default", nil, withDefault, "def"},
		{"the newest of two defaults", nil, twoDefaults, "newer-def"},
		{"spec when it exists", name("b"), withDefault, "b"},
		{"default when the spec's class is missing", name("missing"), withDefault, "def"},
		{"empty when the spec's class is missing and no default", name("missing"), plain, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ScratchSpaceStorageClassFor(tt.spec, tt.classes); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestDefaultPodResourceRequirements(t *testing.T) {
	q := resource.MustParse
	check := func(t *testing.T, got *corev1.ResourceRequirements, cpuReq, memReq, cpuLim, memLim string) {
		t.Helper()
		for _, c := range []struct {
			list corev1.ResourceList
			name corev1.ResourceName
			want string
		}{
			{got.Requests, corev1.ResourceCPU, cpuReq}, {got.Requests, corev1.ResourceMemory, memReq},
			{got.Limits, corev1.ResourceCPU, cpuLim}, {got.Limits, corev1.ResourceMemory, memLim},
		} {
			v, ok := c.list[c.name]
			if !ok || v.Cmp(q(c.want)) != 0 {
				t.Errorf("%s = %v, want %s", c.name, v.String(), c.want)
			}
		}
	}
	t.Run("defaults", func(t *testing.T) {
		check(t, DefaultPodResourceRequirements(nil), "100m", "60M", "750m", "600M")
	})
	t.Run("spec values replace defaults one by one", func(t *testing.T) {
		spec := &corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceMemory: q("1Gi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: q("2")},
		}
		check(t, DefaultPodResourceRequirements(spec), "100m", "1Gi", "2", "600M")
		if _, ok := spec.Requests[corev1.ResourceCPU]; ok {
			t.Error("the spec was modified")
		}
	})
}

func TestCDIConfigStatusFor(t *testing.T) {
	now := time.Now()
	classes := []storagev1.StorageClass{storageClass("local", true, now), storageClass("other", false, now)}
	str := func(s string) *string { return &s }
	ca := "ca-bundle"
	tests := []struct {
		name     string
		spec     cdiv1.CDIConfigSpec
		current  cdiv1.CDIConfigStatus
		flagURL  string
		check    func(t *testing.T, s cdiv1.CDIConfigStatus)
		wantErr  bool
		wantSame bool
	}{
		{
			name: "empty spec, no flag",
			check: func(t *testing.T, s cdiv1.CDIConfigStatus) {
				if s.UploadProxyURL != nil {
					t.Errorf("uploadProxyURL = %q, want unset", *s.UploadProxyURL)
				}
				if s.ScratchSpaceStorageClass != "local" {
					t.Errorf("scratchSpaceStorageClass = %q", s.ScratchSpaceStorageClass)
				}
				if s.Preallocation {
					t.Error("preallocation on")
				}
				want := &cdiv1.FilesystemOverhead{Global: "0.06", StorageClass: map[string]cdiv1.Percent{"local": "0.06", "other": "0.06"}}
				if !reflect.DeepEqual(s.FilesystemOverhead, want) {
					t.Errorf("filesystemOverhead = %+v", s.FilesystemOverhead)
				}
				p := s.ImportProxy
				if p == nil || p.HTTPProxy == nil || *p.HTTPProxy != "" || p.HTTPSProxy == nil || p.NoProxy == nil || p.TrustedCAProxy == nil {
					t.Errorf("importProxy = %+v, want every field present and empty", p)
				}
				if s.DefaultPodResourceRequirements == nil || len(s.DefaultPodResourceRequirements.Limits) != 2 {
					t.Errorf("defaultPodResourceRequirements = %v", s.DefaultPodResourceRequirements)
				}
				if s.ImagePullSecrets != nil {
					t.Errorf("imagePullSecrets = %v", s.ImagePullSecrets)
				}
			},
		},
		{
			name: "flag URL used without an override", flagURL: "upload.example.test:31001",
			check: func(t *testing.T, s cdiv1.CDIConfigStatus) {
				if ptrString(s.UploadProxyURL) != "upload.example.test:31001" {
					t.Errorf("uploadProxyURL = %q", ptrString(s.UploadProxyURL))
				}
			},
		},
		{
			name: "spec override wins over the flag", flagURL: "flag.test", spec: cdiv1.CDIConfigSpec{UploadProxyURLOverride: str("override.test")},
			check: func(t *testing.T, s cdiv1.CDIConfigStatus) {
				if ptrString(s.UploadProxyURL) != "override.test" {
					t.Errorf("uploadProxyURL = %q", ptrString(s.UploadProxyURL))
				}
			},
		},
		{
			name: "spec values copied",
			spec: cdiv1.CDIConfigSpec{
				ScratchSpaceStorageClass: str("other"),
				Preallocation:            func() *bool { b := true; return &b }(),
				ImportProxy:              &cdiv1.ImportProxy{HTTPProxy: str("http://proxy.test:3128")},
				ImagePullSecrets:         []corev1.LocalObjectReference{{Name: "pull"}},
				FilesystemOverhead:       &cdiv1.FilesystemOverhead{Global: "0.1", StorageClass: map[string]cdiv1.Percent{"local": "0.2"}},
			},
			current: cdiv1.CDIConfigStatus{UploadProxyCA: &ca},
			check: func(t *testing.T, s cdiv1.CDIConfigStatus) {
				if s.ScratchSpaceStorageClass != "other" || !s.Preallocation {
					t.Errorf("scratch %q preallocation %v", s.ScratchSpaceStorageClass, s.Preallocation)
				}
				if ptrString(s.ImportProxy.HTTPProxy) != "http://proxy.test:3128" || s.ImportProxy.NoProxy != nil {
					t.Errorf("importProxy = %+v", s.ImportProxy)
				}
				if len(s.ImagePullSecrets) != 1 || s.ImagePullSecrets[0].Name != "pull" {
					t.Errorf("imagePullSecrets = %v", s.ImagePullSecrets)
				}
				if s.FilesystemOverhead.Global != "0.1" || s.FilesystemOverhead.StorageClass["local"] != "0.2" || s.FilesystemOverhead.StorageClass["other"] != "0.1" {
					t.Errorf("filesystemOverhead = %+v", s.FilesystemOverhead)
				}
				if ptrString(s.UploadProxyCA) != ca {
					t.Errorf("uploadProxyCA not kept: %v", s.UploadProxyCA)
				}
			},
		},
		{
			name:    "invalid overhead is an error",
			spec:    cdiv1.CDIConfigSpec{FilesystemOverhead: &cdiv1.FilesystemOverhead{Global: "0.5555"}},
			wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := CDIConfigStatusFor(tt.spec, tt.current, classes, tt.flagURL)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("no error, status %+v", got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, got)
			again, _ := CDIConfigStatusFor(tt.spec, got, classes, tt.flagURL)
			if !reflect.DeepEqual(again, got) {
				t.Errorf("not idempotent:\n%+v\n%+v", got, again)
			}
		})
	}
}

func TestConfigSpecFromCDI(t *testing.T) {
	cdi := func(name string, authority bool, phase cdiv1.CDIPhase, config *cdiv1.CDIConfigSpec) cdiv1.CDI {
		c := cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: cdiv1.CDISpec{Config: config}, Status: cdiv1.CDIStatus{Phase: phase}}
		if authority {
			c.Annotations = map[string]string{AnnConfigAuthority: ""}
		}
		return c
	}
	prealloc := &cdiv1.CDIConfigSpec{Preallocation: func() *bool { b := true; return &b }()}
	tests := []struct {
		name          string
		cdis          []cdiv1.CDI
		authoritative bool
		wantPrealloc  bool
		wantErr       bool
	}{
		{"no CDI", nil, false, false, false},
		{"CDI without the annotation", []cdiv1.CDI{cdi("cdi", false, "Deployed", prealloc)}, false, false, false},
		{"annotated CDI with config", []cdiv1.CDI{cdi("cdi", true, "Deployed", prealloc)}, true, true, false},
		{"annotated CDI without config empties the spec", []cdiv1.CDI{cdi("cdi", true, "Deployed", nil)}, true, false, false},
		{"the one not in Error is active", []cdiv1.CDI{cdi("old", false, "Error", nil), cdi("cdi", true, "Deployed", prealloc)}, true, true, false},
		{"two active is an error", []cdiv1.CDI{cdi("a", true, "Deployed", nil), cdi("b", true, "Deployed", nil)}, false, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec, authoritative, err := ConfigSpecFromCDI(tt.cdis)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if authoritative != tt.authoritative {
				t.Errorf("authoritative = %v, want %v", authoritative, tt.authoritative)
			}
			if got := spec.Preallocation != nil && *spec.Preallocation; got != tt.wantPrealloc {
				t.Errorf("preallocation = %v, want %v", got, tt.wantPrealloc)
			}
		})
	}
	// The returned spec is a copy.
	cdis := []cdiv1.CDI{cdi("cdi", true, "Deployed", prealloc)}
	spec, _, _ := ConfigSpecFromCDI(cdis)
	*spec.Preallocation = false
	if !*cdis[0].Spec.Config.Preallocation {
		t.Error("the CDI resource was modified through the result")
	}
}
