package cloneauth

import (
	"context"
	"errors"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/token"
)

func cronWith(ns string, sa *string, src *cdiv1.DataVolumeSource) *cdiv1.DataImportCron {
	return &cdiv1.DataImportCron{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "golden"},
		Spec: cdiv1.DataImportCronSpec{ServiceAccountName: sa, ManagedDataSource: "golden",
			Template: cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{Source: src}}},
	}
}

func TestCronCloneSource(t *testing.T) {
	url := "docker://quay.io/containerdisks/fedora:40"
	cases := []struct {
		name string
		cron *cdiv1.DataImportCron
		want *Source
		err  error
	}{
		{"registry clones nothing", cronWith("a", nil, &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: &url}}), nil, nil},
		{"no source", cronWith("a", nil, nil), nil, nil},
		{"pvc in another namespace", cronWith("a", nil, &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "b", Name: "x"}}),
			&Source{Resource: token.ResourcePVC, Namespace: "b", Name: "x"}, nil},
		{"pvc namespace defaults to the cron's", cronWith("a", nil, &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Name: "x"}}),
			&Source{Resource: token.ResourcePVC, Namespace: "a", Name: "x"}, nil},
		{"snapshot (only without the webhook)", cronWith("a", nil, &cdiv1.DataVolumeSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{Namespace: "b", Name: "s"}}),
			&Source{Resource: token.ResourceVolumeSnapshot, Namespace: "b", Name: "s"}, nil},
	}
	ref := cronWith("a", nil, nil)
	ref.Spec.Template.Spec.SourceRef = &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: "ds"}
	cases = append(cases, struct {
		name string
		cron *cdiv1.DataImportCron
		want *Source
		err  error
	}{"sourceRef is never a cron's", ref, nil, ErrCronSourceRef})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := CronCloneSource(c.cron)
			if !errors.Is(err, c.err) {
				t.Fatalf("error %v, want %v", err, c.err)
			}
			if (got == nil) != (c.want == nil) || got != nil && *got != *c.want {
				t.Errorf("source %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestCronUser(t *testing.T) {
	if u := CronUser(cronWith("a", nil, nil)); u.Username != "system:serviceaccount:a:default" || u.Groups[1] != "system:serviceaccounts:a" {
		t.Errorf("no serviceAccountName: %+v", u)
	}
	sa := "importer"
	if u := CronUser(cronWith("a", &sa, nil)); u.Username != "system:serviceaccount:a:importer" {
		t.Errorf("serviceAccountName importer: %+v", u)
	}
}

// sarClient answers SubjectAccessReviews: allowed when allow says so.
func sarClient(t *testing.T, allow func(user string, at authorizationv1.ResourceAttributes) bool, seen *[]string) client.Client {
	t.Helper()
	return fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
			sar, ok := obj.(*authorizationv1.SubjectAccessReview)
			if !ok {
				t.Fatalf("unexpected create of %T", obj)
			}
			at := *sar.Spec.ResourceAttributes
			if seen != nil {
				*seen = append(*seen, sar.Spec.User+" "+at.Verb+" "+at.Resource+"/"+at.Subresource+" in "+at.Namespace)
			}
			sar.Status.Allowed = allow(sar.Spec.User, at)
			return nil
		},
	}).Build()
}

func TestAuthorizeCron(t *testing.T) {
	pvcB := &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "b", Name: "x"}}
	url := "docker://r/i:1"
	sa := "golden-images"
	cases := []struct {
		name    string
		cron    *cdiv1.DataImportCron
		allow   func(string, authorizationv1.ResourceAttributes) bool
		ok      bool
		want    []string // substrings of the refusal
		reviews int
	}{
		{"registry: no review", cronWith("a", nil, &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: &url}}),
			func(string, authorizationv1.ResourceAttributes) bool { return false }, true, nil, 0},
		{"default ServiceAccount without rights in b", cronWith("a", nil, pvcB),
			func(string, authorizationv1.ResourceAttributes) bool { return false }, false,
			[]string{"DataImportCron a/golden clones b/x as ServiceAccount a/default", "spec.serviceAccountName is unset",
				`"system:serviceaccount:a:default" may not clone PersistentVolumeClaim b/x`, "create on datavolumes/source", `in namespace "b"`}, 2},
		{"named ServiceAccount granted datavolumes/source in b", cronWith("a", &sa, pvcB),
			func(u string, at authorizationv1.ResourceAttributes) bool {
				return u == "system:serviceaccount:a:golden-images" && at.Namespace == "b" && at.Subresource == "source" && at.Name == "x"
			}, true, nil, 1},
		{"named ServiceAccount allowed only in its own namespace", cronWith("a", &sa, pvcB),
			func(_ string, at authorizationv1.ResourceAttributes) bool { return at.Namespace == "a" }, false,
			[]string{"as ServiceAccount a/golden-images (spec.serviceAccountName)", `"system:serviceaccount:a:golden-images" may not clone`}, 2},
		{"implicit: create pods in b", cronWith("a", nil, pvcB),
			func(_ string, at authorizationv1.ResourceAttributes) bool { return at.Resource == "pods" }, true, nil, 2},
	}
	ref := cronWith("a", nil, nil)
	ref.Spec.Template.Spec.SourceRef = &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: "ds", Namespace: &sa}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var seen []string
			ok, msg, err := Authorizer{Client: sarClient(t, c.allow, &seen)}.AuthorizeCron(context.Background(), c.cron)
			if err != nil {
				t.Fatal(err)
			}
			if ok != c.ok {
				t.Fatalf("allowed %v, want %v (%s)", ok, c.ok, msg)
			}
			for _, w := range c.want {
				if !strings.Contains(msg, w) {
					t.Errorf("refusal %q does not say %q", msg, w)
				}
			}
			if len(seen) != c.reviews {
				t.Errorf("reviews %v, want %d", seen, c.reviews)
			}
		})
	}
	t.Run("sourceRef refused without a review", func(t *testing.T) {
		var seen []string
		ok, msg, err := Authorizer{Client: sarClient(t, func(string, authorizationv1.ResourceAttributes) bool { return true }, &seen)}.AuthorizeCron(context.Background(), ref)
		if err != nil || ok || !strings.Contains(msg, "spec.sourceRef") || len(seen) != 0 {
			t.Errorf("allowed %v, message %q, error %v, reviews %v", ok, msg, err, seen)
		}
	})
}
