package integration

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/apiserver/admission"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/tests/kit"
)

const cdiTestVersion = "v9.8.7-cdi-test"

// operandDeployment is one of the install's Deployments. No
// kube-controller-manager or kubelet runs here: the test sets its status.
func operandDeployment(ns, name string) *appsv1.Deployment {
	labels := map[string]string{cdiv1.LabelAppName: "kubefill", cdiv1.LabelAppComponent: name}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "kubefill/kubefill:test"}}},
			},
		},
	}
}

// setReady reports a Deployment's one replica as ready or not, as the
// Deployment controller would.
func setReady(t *testing.T, ns, name string, ready bool) {
	t.Helper()
	d := &appsv1.Deployment{}
	if err := k8sClient.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: name}, d); err != nil {
		t.Fatal(err)
	}
	d.Status.Replicas, d.Status.ReadyReplicas, d.Status.AvailableReplicas = 1, 0, 0
	if ready {
		d.Status.ReadyReplicas, d.Status.AvailableReplicas = 1, 1
	}
	if err := k8sClient.Status().Update(context.Background(), d); err != nil {
		t.Fatalf("setting Deployment %s/%s ready=%v: %v", ns, name, ready, err)
	}
}

func condition(st cdiv1.CDIStatus, typ string) cdiv1.OperatorCondition {
	for _, c := range st.Conditions {
		if c.Type == typ {
			return c
		}
	}
	return cdiv1.OperatorCondition{}
}

// conditionsAre says "Available/Progressing/Degraded" statuses, e.g. "True/False/False".
func conditionsAre(st cdiv1.CDIStatus) string {
	return fmt.Sprintf("%s/%s/%s", condition(st, cdiv1.CDIConditionAvailable).Status,
		condition(st, cdiv1.CDIConditionProgressing).Status, condition(st, cdiv1.CDIConditionDegraded).Status)
}

func waitCDI(t *testing.T, name, what string, cond func(*cdiv1.CDI) bool) *cdiv1.CDI {
	t.Helper()
	return kit.Await(t, 30*time.Second, 100*time.Millisecond, "CDI "+name+" "+what,
		func() (*cdiv1.CDI, error) {
			cr := &cdiv1.CDI{}
			return cr, k8sClient.Get(context.Background(), types.NamespacedName{Name: name}, cr)
		}, cond, func(cr *cdiv1.CDI) string {
			return fmt.Sprintf("phase %q conditions %s %+v versions %q/%q/%q finalizers %v annotations %v", cr.Status.Phase, conditionsAre(cr.Status),
				cr.Status.Conditions, cr.Status.OperatorVersion, cr.Status.TargetVersion, cr.Status.ObservedVersion, cr.Finalizers, cr.Annotations)
		})
}

// crReadyGauge reads kubevirt_cdi_cr_ready from the registry the manager serves.
func crReadyGauge(t *testing.T) float64 {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "kubevirt_cdi_cr_ready" && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("kubevirt_cdi_cr_ready is not registered")
	return 0
}

// serveCDIValidate serves the cdi-validate webhook on loopback with a test
// certificate and registers it with kube-apiserver as manifests/install does
// (DELETE of cdis), until the test ends.
func serveCDIValidate(t *testing.T, c client.Client) {
	t.Helper()
	srv := httptest.NewUnstartedServer(admission.Handler("cdi-validate", (&admission.CDIValidator{Client: c}).Admit))
	srv.StartTLS()
	t.Cleanup(srv.Close)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	url := srv.URL + admission.PathCDIValidate
	fail, none, exact := admissionregistrationv1.Fail, admissionregistrationv1.SideEffectClassNone, admissionregistrationv1.Exact
	all := admissionregistrationv1.AllScopes
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "cdi-api-validate"},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name: "cdi-validate.cdi.kubevirt.io", ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: caPEM},
			Rules: []admissionregistrationv1.RuleWithOperations{{Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Delete},
				Rule: admissionregistrationv1.Rule{APIGroups: []string{cdiv1.GroupName}, APIVersions: []string{"v1beta1"}, Resources: []string{"cdis"}, Scope: &all}}},
			FailurePolicy: &fail, SideEffects: &none, MatchPolicy: &exact, AdmissionReviewVersions: []string{"v1"}, TimeoutSeconds: ptr.To(int32(10)),
		}},
	}
	if err := k8sClient.Create(context.Background(), vwc); err != nil {
		t.Fatalf("registering cdi-validate: %v", err)
	}
	t.Cleanup(func() { _ = k8sClient.Delete(context.Background(), vwc) })
}

// TestCDIResourceStatus runs the controller manager against a control plane
// of the test's own (CDI resources are cluster-scoped, and the cdi-validate
// webhook sees every deletion of one) and checks that the CDI resource
// reports health as CDI's operator does: Deploying until the install
// namespace's Deployments are ready, then Deployed with CDI's conditions and
// versions, Degraded while one is unready, a second resource in Error, the
// configAuthority hand-over of spec.config, and uninstallStrategy
// BlockUninstallIfWorkloadsExist enforced by the real webhook. The
// controller runs as the install's ServiceAccount and the webhook reads as
// the API server's, with manifests/install's RBAC: neither is refused anything.
func TestCDIResourceStatus(t *testing.T) {
	envCfg, envClient := startOwnControlPlane(t, ownEnvironment(t), "the CDI resource's control plane")
	useControlPlane(t, envCfg, envClient)
	ctx := context.Background()
	if err := doApplyInstall(); err != nil {
		t.Fatalf("installing manifests/install's namespace and RBAC: %v", err)
	}
	installNS := installNamespace
	for _, name := range []string{"kubefill-controller", "kubefill-api"} {
		if err := k8sClient.Create(ctx, operandDeployment(installNS, name)); err != nil {
			t.Fatal(err)
		}
	}
	apiRec := &forbiddenLog{}
	apiClient, err := client.New(impersonating(apiserverSA, apiRec), client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	serveCDIValidate(t, apiClient)
	t.Cleanup(func() { assertNoForbidden(t, "the API server's ServiceAccount (cdi-validate)", apiRec) })
	ctrlRec := &forbiddenLog{}
	mgr, err := controller.NewManager(impersonating(controllerSA, ctrlRec), controller.ManagerOptions{MetricsBindAddress: "0", HealthProbeBindAddress: "0",
		WorkerImage: "kubefill/kubefill:test", InstallNamespace: installNS, Version: cdiTestVersion, SkipNameValidation: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { assertNoForbidden(t, "the controller's ServiceAccount", ctrlRec) })
	startUntilCleanup(t, mgr)

	// The user's CDIConfig spec before any CDI resource exists (the
	// controller writes its status meanwhile: retry on conflicts).
	kit.Until(t, 30*time.Second, "CDIConfig config to be created", func() bool {
		return k8sClient.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, &cdiv1.CDIConfig{}) == nil
	})
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c := &cdiv1.CDIConfig{}
		if err := k8sClient.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, c); err != nil {
			return err
		}
		c.Spec.FeatureGates = []string{"HonorWaitForFirstConsumer"}
		return k8sClient.Update(ctx, c)
	}); err != nil {
		t.Fatal(err)
	}

	block := cdiv1.CDIUninstallStrategyBlockUninstallIfWorkloadsExist
	first := &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi"}, Spec: cdiv1.CDISpec{UninstallStrategy: &block}}
	if err := k8sClient.Create(ctx, first); err != nil {
		t.Fatal(err)
	}
	// Deleted while the manager still runs (cleanups run last-in first-out),
	// so that the finalizer goes.
	t.Cleanup(func() { deleteCDIs(t) })

	// 1. Deploying while the operands are not ready, with the finalizer, the
	// versions, the claim on cdi-config, and spec.config seeded from CDIConfig.
	cr := waitCDI(t, "cdi", "to be Deploying", func(cr *cdiv1.CDI) bool {
		return cr.Status.Phase == cdiv1.CDIPhaseDeploying && conditionsAre(cr.Status) == "False/True/False"
	})
	if c := condition(cr.Status, cdiv1.CDIConditionProgressing); c.Reason != "DeployStarted" || c.Message != "Started Deployment" {
		t.Errorf("Progressing while deploying: %+v", c)
	}
	if cr.Status.OperatorVersion != cdiTestVersion || cr.Status.TargetVersion != cdiTestVersion || cr.Status.ObservedVersion != "" {
		t.Errorf("versions while deploying: operator %q target %q observed %q", cr.Status.OperatorVersion, cr.Status.TargetVersion, cr.Status.ObservedVersion)
	}
	if !slices.Contains(cr.Finalizers, "operator.cdi.kubevirt.io") {
		t.Errorf("finalizers %v lack operator.cdi.kubevirt.io", cr.Finalizers)
	}
	if _, ok := cr.Annotations["cdi.kubevirt.io/configAuthority"]; !ok {
		t.Errorf("annotations %v lack cdi.kubevirt.io/configAuthority", cr.Annotations)
	}
	if cr.Spec.Config == nil || !slices.Equal(cr.Spec.Config.FeatureGates, []string{"HonorWaitForFirstConsumer"}) {
		t.Errorf("spec.config %+v was not seeded from the CDIConfig's spec", cr.Spec.Config)
	}
	cm := &corev1.ConfigMap{}
	if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: installNS, Name: "cdi-config"}, cm); err != nil {
		t.Fatalf("the claim ConfigMap: %v", err)
	}
	if !metav1.IsControlledBy(cm, cr) {
		t.Errorf("cdi-config owners %+v: want CDI %s as controller", cm.OwnerReferences, cr.Name)
	}
	if v := crReadyGauge(t); v == 1 {
		t.Errorf("kubevirt_cdi_cr_ready = 1 while deploying")
	}

	// 2. Deployed once both Deployments are ready.
	setReady(t, installNS, "kubefill-controller", true)
	time.Sleep(300 * time.Millisecond)
	if cr := waitCDI(t, "cdi", "read", func(*cdiv1.CDI) bool { return true }); cr.Status.Phase != cdiv1.CDIPhaseDeploying {
		t.Errorf("phase %q with one operand of two ready, want Deploying", cr.Status.Phase)
	}
	setReady(t, installNS, "kubefill-api", true)
	cr = waitCDI(t, "cdi", "to be Deployed", func(cr *cdiv1.CDI) bool {
		return cr.Status.Phase == cdiv1.CDIPhaseDeployed && conditionsAre(cr.Status) == "True/False/False"
	})
	if c := condition(cr.Status, cdiv1.CDIConditionAvailable); c.Reason != "DeployCompleted" || c.Message != "Deployment Completed" {
		t.Errorf("Available when deployed: %+v", c)
	}
	if cr.Status.ObservedVersion != cdiTestVersion {
		t.Errorf("observedVersion %q, want %q", cr.Status.ObservedVersion, cdiTestVersion)
	}
	kit.Until(t, 10*time.Second, "kubevirt_cdi_cr_ready to be 1", func() bool { return crReadyGauge(t) == 1 })

	// 3. Degraded while an operand is unready, then healthy again.
	setReady(t, installNS, "kubefill-api", false)
	cr = waitCDI(t, "cdi", "to be Degraded", func(cr *cdiv1.CDI) bool {
		return cr.Status.Phase == cdiv1.CDIPhaseDeployed && conditionsAre(cr.Status) == "True/False/True"
	})
	if msg := condition(cr.Status, cdiv1.CDIConditionDegraded).Message; !strings.Contains(msg, "kubefill-api") {
		t.Errorf("Degraded message %q does not name the unready Deployment", msg)
	}
	setReady(t, installNS, "kubefill-api", true)
	waitCDI(t, "cdi", "to be healthy again", func(cr *cdiv1.CDI) bool { return conditionsAre(cr.Status) == "True/False/False" })

	// 4. spec.config is the CDIConfig's spec from now on.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cr := &cdiv1.CDI{}
		if err := k8sClient.Get(ctx, types.NamespacedName{Name: "cdi"}, cr); err != nil {
			return err
		}
		cr.Spec.Config = &cdiv1.CDIConfigSpec{FeatureGates: []string{"DataVolumeClaimAdoption"}, InsecureRegistries: []string{"registry.test:5000"}}
		return k8sClient.Update(ctx, cr)
	}); err != nil {
		t.Fatal(err)
	}
	kit.Eventually(t, 30*time.Second, 100*time.Millisecond, "CDIConfig spec to follow the CDI resource's spec.config", func() (bool, string, error) {
		c := &cdiv1.CDIConfig{}
		if err := k8sClient.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, c); err != nil {
			return false, "", err
		}
		return slices.Equal(c.Spec.FeatureGates, []string{"DataVolumeClaimAdoption"}) && slices.Equal(c.Spec.InsecureRegistries, []string{"registry.test:5000"}),
			fmt.Sprintf("spec %+v", c.Spec), nil
	})

	// 5. A second CDI resource is unwanted.
	second := &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi-second"}, Spec: cdiv1.CDISpec{UninstallStrategy: &block}}
	if err := k8sClient.Create(ctx, second); err != nil {
		t.Fatal(err)
	}
	second = waitCDI(t, "cdi-second", "to be in Error", func(cr *cdiv1.CDI) bool {
		return cr.Status.Phase == cdiv1.CDIPhaseError && conditionsAre(cr.Status) == "False/False/True"
	})
	if c := condition(second.Status, cdiv1.CDIConditionDegraded); c.Reason != "ConfigError" || c.Message != "Reconciling to error state, unwanted CDI object" {
		t.Errorf("Degraded of the unwanted CDI: %+v", c)
	}
	if slices.Contains(second.Finalizers, "operator.cdi.kubevirt.io") {
		t.Errorf("the unwanted CDI got the finalizer: %v", second.Finalizers)
	}
	if cr := waitCDI(t, "cdi", "read", func(*cdiv1.CDI) bool { return true }); cr.Status.Phase != cdiv1.CDIPhaseDeployed {
		t.Errorf("the first CDI went %q when a second appeared", cr.Status.Phase)
	}

	// 6. BlockUninstallIfWorkloadsExist: refused while a DataVolume exists;
	// the unwanted one (phase Error) is deletable regardless.
	ns := newNamespace(t)
	dv := blankDataVolume(ns, "workload")
	if err := k8sClient.Create(ctx, dv); err != nil {
		t.Fatal(err)
	}
	cron := blankDataVolume(ns, "from-a-cron")
	cron.Labels = map[string]string{cdiv1.LabelDataImportCron: "nightly"}
	if err := k8sClient.Create(ctx, cron); err != nil {
		t.Fatal(err)
	}
	err = k8sClient.Delete(ctx, &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi"}})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "rejecting the uninstall request, since there are still 1 DataVolumes present") {
		t.Fatalf("deleting the CDI resource with a DataVolume present: got %v, want CDI's refusal", err)
	}
	if err := k8sClient.Delete(ctx, &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi-second"}}); err != nil {
		t.Errorf("deleting the unwanted CDI resource: %v", err)
	}
	if err := k8sClient.Delete(ctx, dv); err != nil {
		t.Fatal(err)
	}
	kit.Until(t, 30*time.Second, "the DataVolume to go", func() bool {
		return apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKeyFromObject(dv), &cdiv1.DataVolume{}))
	})
	// A DataImportCron's DataVolume does not block.
	if err := k8sClient.Delete(ctx, &cdiv1.CDI{ObjectMeta: metav1.ObjectMeta{Name: "cdi"}}); err != nil {
		t.Fatalf("deleting the CDI resource with only a cron's DataVolume left: %v", err)
	}
	kit.Until(t, 30*time.Second, "the CDI resource to go (the controller removes its finalizer)", func() bool {
		return apierrors.IsNotFound(k8sClient.Get(ctx, types.NamespacedName{Name: "cdi"}, &cdiv1.CDI{}))
	})
}

// deleteCDIs removes every CDI resource of the control plane, the
// finalizers too if the controller has not (the webhook is gone by now).
func deleteCDIs(t *testing.T) {
	ctx := context.Background()
	var list cdiv1.CDIList
	if err := k8sClient.List(ctx, &list); err != nil {
		t.Logf("listing CDI resources: %v", err)
		return
	}
	for i := range list.Items {
		cr := &list.Items[i]
		_ = k8sClient.Delete(ctx, cr)
		if len(cr.Finalizers) > 0 {
			patch := client.MergeFrom(cr.DeepCopy())
			cr.Finalizers = nil
			_ = k8sClient.Patch(ctx, cr, patch)
		}
	}
}
