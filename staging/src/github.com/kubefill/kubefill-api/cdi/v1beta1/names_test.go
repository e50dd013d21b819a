package v1beta1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestUploadServiceName(t *testing.T) {
	long := strings.Repeat("a", 60)
	cases := []struct {
		claim, want string
	}{
		// CDI's names, unchanged, whenever they are labels.
		{"disk", "cdi-upload-disk"},
		{"prime-0b4f3a2e-6f1c-4c1e-9d4e-2b8f0c6a1d77", "cdi-upload-prime-0b4f3a2e-6f1c-4c1e-9d4e-2b8f0c6a1d77"},
		{"tmp-pvc-0b4f3a2e-6f1c-4c1e-9d4e-2b8f0c6a1d77", "cdi-upload-tmp-pvc-0b4f3a2e-6f1c-4c1e-9d4e-2b8f0c6a1d77"},
		{strings.Repeat("a", 52), "cdi-upload-" + strings.Repeat("a", 52)},
		// A dotted name is no label: hashed, and never a name of another namespace.
		{"victim.b.svc", "cdi-upload-victim-b-svc-" + nameHash("victim.b.svc")},
		{"a.b", "cdi-upload-a-b-" + nameHash("a.b")},
		// Too long for a label.
		{long, "cdi-upload-" + long[:43] + "-" + nameHash(long)},
		{strings.Repeat("a", 53), "cdi-upload-" + strings.Repeat("a", 43) + "-" + nameHash(strings.Repeat("a", 53))},
		// The cut lands on a dash: no double dash before the hash.
		{strings.Repeat("a", 42) + "-b.c", "cdi-upload-" + strings.Repeat("a", 42) + "-" + nameHash(strings.Repeat("a", 42)+"-b.c")},
	}
	for _, c := range cases {
		got := UploadServiceName(c.claim)
		if got != c.want {
			t.Errorf("UploadServiceName(%q) = %q, want %q", c.claim, got, c.want)
		}
		if errs := validation.IsDNS1035Label(got); len(errs) > 0 {
			t.Errorf("UploadServiceName(%q) = %q is no DNS-1035 label: %v", c.claim, got, errs)
		}
	}
	if UploadServiceName("a.b") == UploadServiceName("a-b") {
		t.Errorf("claims a.b and a-b share the Service %s", UploadServiceName("a-b"))
	}
	if got, want := UploadServiceHost("vms", "disk"), "cdi-upload-disk.vms.svc"; got != want {
		t.Errorf("UploadServiceHost = %q, want %q", got, want)
	}
	// Whatever the claim is called, the host stays in its namespace: three
	// labels, <service>.<namespace>.svc.
	for _, claim := range []string{"victim.b.svc", "x.b", "cdi-upload-x.b.svc.cluster.local", strings.Repeat("x.", 120) + "y"} {
		host := UploadServiceHost("a", claim)
		if parts := strings.Split(host, "."); len(parts) != 3 || parts[1] != "a" || parts[2] != "svc" {
			t.Errorf("UploadServiceHost(a, %q) = %q, not <service>.a.svc", claim, host)
		}
	}
}

func TestUploadPodName(t *testing.T) {
	cases := []struct {
		claim, want string
	}{
		{"disk", "cdi-upload-disk"},
		{"victim.b.svc", "cdi-upload-victim.b.svc"},
		{strings.Repeat("a", 242), "cdi-upload-" + strings.Repeat("a", 242)},
		// CDI's GetResourceName past 253 characters: the suffix alone is too long.
		{strings.Repeat("a", 243), "cdi-upload-" + nameHash("cdi-upload-"+strings.Repeat("a", 243))},
	}
	for _, c := range cases {
		got := UploadPodName(c.claim)
		if got != c.want {
			t.Errorf("UploadPodName(%q) = %q, want %q", c.claim, got, c.want)
		}
		if errs := validation.IsDNS1123Subdomain(got); len(errs) > 0 {
			t.Errorf("UploadPodName(%q) = %q: %v", c.claim, got, errs)
		}
	}
	if got, want := shortenedName("base", strings.Repeat("s", 10), 12), "bas-"+nameHash("base-ssssssssss"); got != want {
		t.Errorf("shortenedName with a long suffix = %q, want %q", got, want)
	}
	if got, want := shortenedName(strings.Repeat("b", 20), "sfx", 23), strings.Repeat("b", 10)+"-"+nameHash(strings.Repeat("b", 20))+"-sfx"; got != want {
		t.Errorf("shortenedName with a long base = %q, want %q", got, want)
	}
}
