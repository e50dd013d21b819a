package admission

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// goodCron is what HCO's centos-stream9-image-cron template renders.
func goodCron() *cdiv1.DataImportCron {
	return &cdiv1.DataImportCron{
		ObjectMeta: metav1.ObjectMeta{Namespace: "kubevirt-os-images", Name: "centos-stream9-image-cron"},
		Spec: cdiv1.DataImportCronSpec{
			Template: cdiv1.DataVolume{
				ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{cdiv1.AnnImmediateBinding: "true"}},
				Spec: cdiv1.DataVolumeSpec{
					Source: &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr("docker://quay.io/containerdisks/centos-stream:9")}},
					Storage: &cdiv1.StorageSpec{Resources: corev1.VolumeResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("10Gi")}}},
				},
			},
			Schedule:          "0 */12 * * *",
			ManagedDataSource: "centos-stream9",
		},
	}
}

func TestValidateDataImportCron(t *testing.T) {
	cases := []struct {
		name   string
		change func(*cdiv1.DataImportCron)
		want   []string // substrings of the errors, in order; none: valid
	}{
		{"HCO's template", func(*cdiv1.DataImportCron) {}, nil},
		{"pvc source (CDI v1.62)", func(c *cdiv1.DataImportCron) {
			c.Spec.Template.Spec.Source = &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "os", Name: "golden"}}
		}, nil},
		{"imageStream pulled by the node", func(c *cdiv1.DataImportCron) {
			c.Spec.Template.Spec.Source.Registry = &cdiv1.DataVolumeSourceRegistry{ImageStream: ptr("rhel9-guest"), PullMethod: ptr(cdiv1.RegistryPullNode)}
		}, nil},
		{"empty schedule disables polling", func(c *cdiv1.DataImportCron) { c.Spec.Schedule = "" }, nil},
		{"every option set", func(c *cdiv1.DataImportCron) {
			c.Spec.GarbageCollect = ptr(cdiv1.DataImportCronGarbageCollectNever)
			c.Spec.ImportsToKeep = ptr[int32](0)
			c.Spec.RetentionPolicy = ptr(cdiv1.DataImportCronRetainNone)
		}, nil},
		{"http source", func(c *cdiv1.DataImportCron) {
			c.Spec.Template.Spec.Source = &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://example.test/disk.qcow2"}}
		}, []string{"spec.template.spec.source: Required value: Missing source"}},
		{"no source", func(c *cdiv1.DataImportCron) { c.Spec.Template.Spec.Source = nil },
			[]string{"Missing source"}},
		{"sourceRef", func(c *cdiv1.DataImportCron) {
			c.Spec.Template.Spec.SourceRef = &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: "x"}
		}, []string{"spec.template.spec.sourceRef: Forbidden: Unsettable fields: SourceRef, ContentType, Checkpoints, FinalCheckpoint"}},
		{"contentType, checkpoints and finalCheckpoint", func(c *cdiv1.DataImportCron) {
			c.Spec.Template.Spec.ContentType = cdiv1.DataVolumeKubeVirt
			c.Spec.Template.Spec.Checkpoints = []cdiv1.DataVolumeCheckpoint{{Previous: "", Current: "a"}}
			c.Spec.Template.Spec.FinalCheckpoint = true
		}, []string{"spec.template.spec.contentType: Forbidden: Unsettable", "spec.template.spec.checkpoints: Forbidden", "spec.template.spec.finalCheckpoint: Forbidden"}},
		{"the template's DataVolume rules", func(c *cdiv1.DataImportCron) { c.Spec.Template.Spec.Storage = nil },
			[]string{"spec.template.spec.storage: Required value: exactly one of spec.pvc or spec.storage"}},
		{"bad registry url", func(c *cdiv1.DataImportCron) { c.Spec.Template.Spec.Source.Registry.URL = ptr("quay.io/x:1") },
			[]string{"spec.template.spec.source.registry.url"}},
		{"six-field schedule", func(c *cdiv1.DataImportCron) { c.Spec.Schedule = "0 0 */12 * * *" },
			[]string{`spec.schedule: Invalid value: "0 0 */12 * * *": Illegal cron schedule`}},
		{"nonsense schedule", func(c *cdiv1.DataImportCron) { c.Spec.Schedule = "every day" },
			[]string{"Illegal cron schedule"}},
		{"negative importsToKeep", func(c *cdiv1.DataImportCron) { c.Spec.ImportsToKeep = ptr[int32](-1) },
			[]string{"spec.importsToKeep: Invalid value: -1: Illegal ImportsToKeep value"}},
		{"garbageCollect", func(c *cdiv1.DataImportCron) {
			c.Spec.GarbageCollect = ptr(cdiv1.DataImportCronGarbageCollect("Always"))
		},
			[]string{`spec.garbageCollect: Unsupported value: "Always": Illegal GarbageCollect value`}},
		{"retentionPolicy", func(c *cdiv1.DataImportCron) {
			c.Spec.RetentionPolicy = ptr(cdiv1.DataImportCronRetentionPolicy("Some"))
		},
			[]string{"spec.retentionPolicy: Unsupported value"}},
		{"no managedDataSource", func(c *cdiv1.DataImportCron) { c.Spec.ManagedDataSource = "" },
			[]string{"spec.managedDataSource: Required value: Illegal ManagedDataSource value"}},
		{"managedDataSource too long", func(c *cdiv1.DataImportCron) { c.Spec.ManagedDataSource = strings.Repeat("a", 64) },
			[]string{"spec.managedDataSource: Invalid value", "Name cannot be longer than 63 characters"}},
		{"managedDataSource not a DNS-1035 label", func(c *cdiv1.DataImportCron) { c.Spec.ManagedDataSource = "9fedora" },
			[]string{"spec.managedDataSource: Invalid value: \"9fedora\": a DNS-1035 label"}},
		{"cron name too long", func(c *cdiv1.DataImportCron) { c.Name = strings.Repeat("c", 64) },
			[]string{"metadata.name", "Name cannot be longer than 63 characters"}},
		{"cron name with a dot", func(c *cdiv1.DataImportCron) { c.Name = "fedora.cron" },
			[]string{"metadata.name: Invalid value: \"fedora.cron\""}},
		{"several problems at once", func(c *cdiv1.DataImportCron) {
			c.Spec.Schedule = "x"
			c.Spec.ManagedDataSource = ""
		}, []string{"Illegal cron schedule", "Illegal ManagedDataSource value"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cron := goodCron()
			c.change(cron)
			errs := ValidateDataImportCron(cron)
			if len(c.want) == 0 {
				if len(errs) > 0 {
					t.Fatalf("refused: %v", errs)
				}
				return
			}
			msg := errs.ToAggregate()
			if msg == nil {
				t.Fatalf("accepted, want errors %q", c.want)
			}
			rest := msg.Error()
			for _, w := range c.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("errors %q lack %q (in order)", msg.Error(), w)
				}
				rest = rest[i+len(w):]
			}
		})
	}
}

func TestValidateDataImportCronUpdate(t *testing.T) {
	old := goodCron()
	same := goodCron()
	same.Labels = map[string]string{"a": "b"}
	same.Annotations = map[string]string{cdiv1.AnnSourceDesiredDigest: "sha256:00"}
	same.Status.LastExecutionTimestamp = &metav1.Time{}
	if errs := ValidateDataImportCronUpdate(same, old); len(errs) > 0 {
		t.Errorf("metadata and status updates refused: %v", errs)
	}
	changed := goodCron()
	changed.Spec.Schedule = "0 * * * *"
	errs := ValidateDataImportCronUpdate(changed, old)
	if len(errs) != 1 || !strings.Contains(errs.ToAggregate().Error(), "spec: Forbidden: Cannot update DataImportCron Spec") {
		t.Errorf("schedule change: %v", errs)
	}
}

func TestAdmitDataImportCron(t *testing.T) {
	raw := func(c *cdiv1.DataImportCron) runtime.RawExtension {
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		return runtime.RawExtension{Raw: b}
	}
	kind := metav1.GroupVersionKind{Group: cdiv1.GroupName, Version: "v1beta1", Kind: "DataImportCron"}
	bad := goodCron()
	bad.Spec.Schedule = "soon"
	changed := goodCron()
	changed.Spec.ImportsToKeep = ptr[int32](5)
	invalidButUnchanged := goodCron()
	invalidButUnchanged.Spec.Schedule = "soon"
	fromB := func(sa *string) *cdiv1.DataImportCron {
		c := goodCron()
		c.Spec.Template.Spec.Source = &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: "b", Name: "secret-disk"}}
		c.Spec.ServiceAccountName = sa
		return c
	}
	sameNS := goodCron()
	sameNS.Spec.Template.Spec.Source = &cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Name: "golden"}}
	createAs := func(c *cdiv1.DataImportCron) admissionv1.AdmissionRequest {
		return admissionv1.AdmissionRequest{Kind: kind, Operation: admissionv1.Create, Namespace: c.Namespace, Object: raw(c),
			UserInfo: authenticationv1.UserInfo{Username: "cluster-admin", Groups: []string{"system:masters"}}}
	}
	cases := []struct {
		name    string
		req     admissionv1.AdmissionRequest
		allowed bool
		code    int32
		message string
	}{
		{"valid create", admissionv1.AdmissionRequest{Kind: kind, Operation: admissionv1.Create, Object: raw(goodCron())}, true, 0, ""},
		{"invalid create", admissionv1.AdmissionRequest{Kind: kind, Operation: admissionv1.Create, Object: raw(bad)}, false, 422,
			`DataImportCron "centos-stream9-image-cron" is invalid: spec.schedule`},
		{"spec update", admissionv1.AdmissionRequest{Kind: kind, Operation: admissionv1.Update, Object: raw(changed), OldObject: raw(goodCron())}, false, 422,
			"Cannot update DataImportCron Spec"},
		{"an unchanged old spec is not re-validated", admissionv1.AdmissionRequest{Kind: kind, Operation: admissionv1.Update,
			Object: raw(invalidButUnchanged), OldObject: raw(invalidButUnchanged)}, true, 0, ""},
		{"another kind", admissionv1.AdmissionRequest{Kind: metav1.GroupVersionKind{Group: cdiv1.GroupName, Version: "v1beta1", Kind: "DataVolume"},
			Operation: admissionv1.Create, Object: raw(goodCron())}, false, 400, "validates DataImportCrons"},
		{"undecodable", admissionv1.AdmissionRequest{Kind: kind, Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: []byte(`{"spec":{"importsToKeep":"x"}}`)}},
			false, 400, "cannot decode the DataImportCron"},
		// The creator's own rights do not matter: the cron clones as its ServiceAccount.
		{"pvc of b, the default ServiceAccount may not clone it", createAs(fromB(nil)), false, 403,
			`DataImportCron kubevirt-os-images/centos-stream9-image-cron clones b/secret-disk as ServiceAccount kubevirt-os-images/default (spec.serviceAccountName is unset, so the namespace's default): ` +
				`user "system:serviceaccount:kubevirt-os-images:default" may not clone PersistentVolumeClaim b/secret-disk: it needs create on datavolumes/source (API group cdi.kubevirt.io) in namespace "b", or create pods there`},
		{"pvc of b, a ServiceAccount granted datavolumes/source there", createAs(fromB(ptr("golden-importer"))), true, 0, ""},
		{"pvc of b, another ServiceAccount", createAs(fromB(ptr("builder"))), false, 403, `"system:serviceaccount:kubevirt-os-images:builder" may not clone`},
		{"pvc of the cron's own namespace is authorised too", createAs(sameNS), false, 403, `may not clone PersistentVolumeClaim kubevirt-os-images/golden`},
	}
	// Only golden-importer may clone, and only from b.
	sars := fake.NewClientBuilder().WithInterceptorFuncs(interceptor.Funcs{Create: func(_ context.Context, _ client.WithWatch, obj client.Object, _ ...client.CreateOption) error {
		sar := obj.(*authorizationv1.SubjectAccessReview)
		at := sar.Spec.ResourceAttributes
		sar.Status.Allowed = sar.Spec.User == "system:serviceaccount:kubevirt-os-images:golden-importer" && at.Namespace == "b" &&
			at.Resource == "datavolumes" && at.Subresource == "source" && at.Name == "secret-disk"
		return nil
	}}).Build()
	v := &DataImportCronValidator{Client: sars}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := v.Admit(context.Background(), &c.req)
			if resp.Allowed != c.allowed {
				t.Fatalf("allowed = %v, want %v (%+v)", resp.Allowed, c.allowed, resp.Result)
			}
			if c.allowed {
				return
			}
			if resp.Result.Code != c.code || !strings.Contains(resp.Result.Message, c.message) {
				t.Errorf("result %d %q, want %d containing %q", resp.Result.Code, resp.Result.Message, c.code, c.message)
			}
		})
	}
}
