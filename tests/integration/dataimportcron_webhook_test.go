package integration

import (
	"context"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/apiserver/admission"
)

// TestDataImportCronWebhook: kube-apiserver calls `kubefill apiserver`'s
// dataimportcron-validate webhook, configured as CDI's
// cdi-api-dataimportcron-validate, and a client sees CDI's refusals.
func TestDataImportCronWebhook(t *testing.T) {
	t.Parallel()
	e := startAggEnv(t)
	rs := e.startServer(t, true)
	ctx := context.Background()
	const label = "kubefill-dic-webhook-test"
	url := "https://" + rs.addr + admission.PathDataImportCronValidate
	fail, none, timeout := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone, int32(10)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "cdi-api-dataimportcron-validate"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "dataimportcron-validate.cdi.kubevirt.io",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: rs.caPEM},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule:       admissionregistrationv1.Rule{APIGroups: []string{cdiv1.GroupName}, APIVersions: []string{"v1beta1"}, Resources: []string{"dataimportcrons"}},
			}},
			FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: &timeout,
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{label: "true"}},
		}},
	}
	if err := e.client.Create(ctx, vwc); err != nil {
		t.Fatal(err)
	}
	ns := e.labelledNamespace(t, "os-images-", label)

	cron := func(name string) *cdiv1.DataImportCron {
		return &cdiv1.DataImportCron{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: cdiv1.DataImportCronSpec{
				Template: cdiv1.DataVolume{Spec: cdiv1.DataVolumeSpec{
					Source: &cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To("docker://quay.io/containerdisks/fedora:latest")}},
					Storage: &cdiv1.StorageSpec{Resources: corev1.VolumeResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("5Gi")}}},
				}},
				Schedule:          "0 */12 * * *",
				ManagedDataSource: "fedora",
			},
		}
	}

	good := cron("fedora-image-cron")
	if err := e.client.Create(ctx, good); err != nil {
		t.Fatalf("a valid DataImportCron was refused: %v", err)
	}

	for _, c := range []struct {
		name   string
		change func(*cdiv1.DataImportCron)
		want   string
	}{
		{"http source", func(c *cdiv1.DataImportCron) {
			c.Spec.Template.Spec.Source = &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://example.test/fedora.qcow2"}}
		}, "Missing source"},
		{"six-field schedule", func(c *cdiv1.DataImportCron) { c.Spec.Schedule = "0 0 */12 * * *" }, "Illegal cron schedule"},
		{"negative importsToKeep", func(c *cdiv1.DataImportCron) { c.Spec.ImportsToKeep = ptr.To[int32](-1) }, "Illegal ImportsToKeep value"},
		{"contentType", func(c *cdiv1.DataImportCron) { c.Spec.Template.Spec.ContentType = cdiv1.DataVolumeArchive },
			"Unsettable fields: SourceRef, ContentType, Checkpoints, FinalCheckpoint"},
		{"no managedDataSource", func(c *cdiv1.DataImportCron) { c.Spec.ManagedDataSource = "" }, "Illegal ManagedDataSource value"},
		{"managedDataSource not a DNS-1035 label", func(c *cdiv1.DataImportCron) { c.Spec.ManagedDataSource = "9-fedora" }, "DNS-1035 label"},
	} {
		t.Run(c.name, func(t *testing.T) {
			bad := cron("bad")
			c.change(bad)
			err := e.client.Create(ctx, bad)
			if !apierrors.IsInvalid(err) || !strings.Contains(statusMessage(err), c.want) {
				t.Errorf("creating: %v; want Invalid saying %q", err, c.want)
			}
			if !strings.Contains(statusMessage(err), `admission webhook "dataimportcron-validate.cdi.kubevirt.io" denied the request`) {
				t.Errorf("not refused by the webhook: %v", err)
			}
		})
	}

	// The spec is immutable; labels and annotations are not.
	changed := good.DeepCopy()
	changed.Spec.Schedule = "0 * * * *"
	if err := e.client.Update(ctx, changed); !apierrors.IsInvalid(err) || !strings.Contains(statusMessage(err), "Cannot update DataImportCron Spec") {
		t.Errorf("updating the schedule: %v; want Invalid saying Cannot update DataImportCron Spec", err)
	}
	meta := good.DeepCopy()
	meta.Annotations = map[string]string{cdiv1.AnnSourceDesiredDigest: "sha256:0123456789abcdef"}
	if err := e.client.Update(ctx, meta); err != nil {
		t.Errorf("annotating the cron (as the poller does): %v", err)
	}
	meta.Status.LastExecutionTimestamp = &metav1.Time{Time: metav1.Now().Rfc3339Copy().Time}
	if err := e.client.Status().Update(ctx, meta); err != nil {
		t.Errorf("updating the status: %v", err)
	}
}
