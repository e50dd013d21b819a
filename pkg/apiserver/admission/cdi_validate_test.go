package admission

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

func TestCDIValidate(t *testing.T) {
	block := cdiv1.CDIUninstallStrategyBlockUninstallIfWorkloadsExist
	remove := cdiv1.CDIUninstallStrategyRemoveWorkloads
	cdi := func(phase cdiv1.CDIPhase, s *cdiv1.CDIUninstallStrategy) *cdiv1.CDI {
		return &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi"}, Spec: cdiv1.CDISpec{UninstallStrategy: s}, Status: cdiv1.CDIStatus{Phase: phase}}
	}
	dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "disk"}}
	cronDV := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "golden", Labels: map[string]string{cdiv1.LabelDataImportCron: "cron"}}}
	cases := []struct {
		name    string
		cdi     *cdiv1.CDI
		op      admissionv1.Operation
		objs    []runtime.Object
		allowed bool
	}{
		{"block with a DataVolume: refused", cdi(cdiv1.CDIPhaseDeployed, &block), admissionv1.Delete, []runtime.Object{dv}, false},
		{"block with only a cron's DataVolume", cdi(cdiv1.CDIPhaseDeployed, &block), admissionv1.Delete, []runtime.Object{cronDV}, true},
		{"block with none", cdi(cdiv1.CDIPhaseDeployed, &block), admissionv1.Delete, nil, true},
		{"remove workloads", cdi(cdiv1.CDIPhaseDeployed, &remove), admissionv1.Delete, []runtime.Object{dv}, true},
		{"no strategy", cdi(cdiv1.CDIPhaseDeployed, nil), admissionv1.Delete, []runtime.Object{dv}, true},
		{"phase Error is always deletable", cdi(cdiv1.CDIPhaseError, &block), admissionv1.Delete, []runtime.Object{dv}, true},
		{"phase empty is always deletable", cdi(cdiv1.CDIPhaseEmpty, &block), admissionv1.Delete, []runtime.Object{dv}, true},
		{"updates are not its business", cdi(cdiv1.CDIPhaseDeployed, &block), admissionv1.Update, []runtime.Object{dv}, true},
	}
	scheme := runtime.NewScheme()
	if err := cdiv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := &CDIValidator{Client: fake.NewClientBuilder().WithScheme(scheme).WithRuntimeObjects(c.objs...).Build()}
			raw, _ := json.Marshal(c.cdi)
			req := &admissionv1.AdmissionRequest{Operation: c.op, Name: "cdi",
				Resource:  metav1.GroupVersionResource{Group: cdiv1.GroupName, Version: "v1beta1", Resource: "cdis"},
				OldObject: runtime.RawExtension{Raw: raw}}
			resp := v.Admit(context.Background(), req)
			if resp.Allowed != c.allowed {
				t.Fatalf("allowed %v, want %v: %+v", resp.Allowed, c.allowed, resp.Result)
			}
			if !resp.Allowed && !strings.Contains(resp.Result.Message, "rejecting the uninstall request, since there are still 1 DataVolumes present") {
				t.Errorf("message %q", resp.Result.Message)
			}
		})
	}
}
