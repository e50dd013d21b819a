package admission

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/token"
)

const testController = "system:serviceaccount:kubefill-system:kubefill-controller"

func TestDefaultControllerUser(t *testing.T) {
	if got := DefaultControllerUser("kubefill-system"); got != testController {
		t.Errorf("%q, want %q", got, testController)
	}
}

// A clone DataVolume the controller asks for is authorised for the
// ServiceAccount of the DataImportCron it is an import of, and refused when
// no cron accounts for it; anyone else's is authorised for them.
func TestDataVolumeMutatorControllerClones(t *testing.T) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	if err := cdiv1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	cron := func(name string, sa *string) *cdiv1.DataImportCron {
		return &cdiv1.DataImportCron{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name}, Spec: cdiv1.DataImportCronSpec{ServiceAccountName: sa}}
	}
	// In b only ServiceAccount team/importer and user alice may clone.
	var reviewed []string
	c := fake.NewClientBuilder().WithScheme(s).WithObjects(cron("granted", ptr("importer")), cron("defaulted", nil)).
		WithInterceptorFuncs(interceptor.Funcs{Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			sar, ok := obj.(*authorizationv1.SubjectAccessReview)
			if !ok {
				return c.Create(ctx, obj, opts...)
			}
			reviewed = append(reviewed, sar.Spec.User)
			u, at := sar.Spec.User, sar.Spec.ResourceAttributes
			sar.Status.Allowed = (u == "system:serviceaccount:team:importer" || u == "alice") && at.Namespace == "b" && at.Subresource == "source"
			return nil
		}}).Build()
	key, err := token.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	m := &DataVolumeMutator{Client: c, Tokens: token.NewGenerator(token.CloneTokenIssuer, key, time.Minute), ControllerUser: testController}
	dv := func(cronLabel string) *cdiv1.DataVolume {
		d := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "x"}, Spec: baseSpec(cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "b", Name: "golden"}})}
		if cronLabel != "" {
			d.Labels = map[string]string{cdiv1.LabelDataImportCron: cronLabel}
		}
		return d
	}
	cases := []struct {
		name     string
		user     string
		dv       *cdiv1.DataVolume
		ctrlUser string
		allowed  bool
		reviewed string // the user the first review was for
		want     []string
	}{
		{"the controller for a cron whose ServiceAccount may clone", testController, dv("granted"), testController, true, "system:serviceaccount:team:importer", nil},
		{"the controller for a cron whose default ServiceAccount may not", testController, dv("defaulted"), testController, false, "system:serviceaccount:team:default",
			[]string{"DataImportCron team/defaulted clones b/golden as ServiceAccount team/default", "create on datavolumes/source", `in namespace "b"`}},
		{"the controller for no cron", testController, dv(""), testController, false, "",
			[]string{"the controller (" + testController + ") asked for DataVolume team/x cloning b/golden, which no DataImportCron accounts for", "never on its own authority"}},
		{"the controller for a cron that does not exist", testController, dv("gone"), testController, false, "",
			[]string{"for DataImportCron team/gone, which does not exist"}},
		{"a user's clone, even labelled as a cron's, is theirs", "alice", dv("defaulted"), testController, true, "alice", nil},
		{"a user without rights labelling a cron's DataVolume gains nothing", "mallory", dv("granted"), testController, false, "mallory",
			[]string{`user "mallory" may not clone`}},
		{"without a controller user nobody is the controller", testController, dv("granted"), "", false, testController, []string{`user "` + testController + `" may not clone`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reviewed = nil
			m.ControllerUser = tc.ctrlUser
			req := review("DataVolume", admissionv1.Create, tc.dv, nil)
			req.UserInfo = authenticationv1.UserInfo{Username: tc.user}
			r := m.Admit(context.Background(), req)
			if r.Allowed != tc.allowed {
				t.Fatalf("allowed %v, want %v: %+v", r.Allowed, tc.allowed, r.Result)
			}
			if tc.allowed && !strings.Contains(string(r.Patch), cdiv1.AnnCloneToken[len("cdi.kubevirt.io/"):]) {
				t.Errorf("allowed without a clone token: %s", r.Patch)
			}
			if !tc.allowed && r.Result.Code != 403 {
				t.Errorf("code %d, want 403", r.Result.Code)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.Result.Message, w) {
					t.Errorf("message %q does not say %q", r.Result.Message, w)
				}
			}
			first := ""
			if len(reviewed) > 0 {
				first = reviewed[0]
			}
			if first != tc.reviewed {
				t.Errorf("reviewed %v, want first %q", reviewed, tc.reviewed)
			}
		})
	}
}
