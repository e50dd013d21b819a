package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/apiserver/admission"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/tests/kit"
)

// registerWebhooks points kube-apiserver at our server on 127.0.0.1 with the
// serving CA as caBundle, limited to namespaces labelled for this test.
func registerWebhooks(t *testing.T, e *aggEnv, rs *runningServer, label string) {
	t.Helper()
	ctx := context.Background()
	url := func(path string) *string { u := "https://" + rs.addr + path; return &u }
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	timeout := int32(10)
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{label: "true"}}
	rule := func(resources []string, ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
		return []admissionregistrationv1.RuleWithOperations{{
			Operations: ops,
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{cdiv1.GroupName}, APIVersions: []string{"v1beta1"}, Resources: resources},
		}}
	}
	hook := func(name, path string) (string, admissionregistrationv1.WebhookClientConfig) {
		return name, admissionregistrationv1.WebhookClientConfig{URL: url(path), CABundle: rs.caPEM}
	}
	vName, vCfg := hook("datavolume-validate.cdi.kubevirt.io", admission.PathDataVolumeValidate)
	pName, pCfg := hook("populator-validate.cdi.kubevirt.io", admission.PathPopulatorValidate)
	mName, mCfg := hook("datavolume-mutate.cdi.kubevirt.io", admission.PathDataVolumeMutate)
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kubefill-validate-" + label},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{Name: vName, ClientConfig: vCfg, Rules: rule([]string{"datavolumes"}, admissionregistrationv1.Create, admissionregistrationv1.Update),
				FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: sel, TimeoutSeconds: &timeout},
			{Name: pName, ClientConfig: pCfg, Rules: rule([]string{"volumeimportsources", "volumeuploadsources", "volumeclonesources"}, admissionregistrationv1.Create, admissionregistrationv1.Update),
				FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: sel, TimeoutSeconds: &timeout},
		},
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kubefill-mutate-" + label},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			{Name: mName, ClientConfig: mCfg, Rules: rule([]string{"datavolumes"}, admissionregistrationv1.Create),
				FailurePolicy: &fail, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: sel, TimeoutSeconds: &timeout},
		},
	}
	for _, o := range []client.Object{vwc, mwc} {
		if err := e.client.Create(ctx, o); err != nil {
			t.Fatalf("registering webhook: %v", err)
		}
	}
}

func (e *aggEnv) labelledNamespace(t *testing.T, prefix, label string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix, Labels: map[string]string{label: "true"}}}
	if err := e.client.Create(context.Background(), ns); err != nil {
		t.Fatal(err)
	}
	return ns.Name
}

func storageDV(ns, name string, src cdiv1.DataVolumeSource) *cdiv1.DataVolume {
	return &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: cdiv1.DataVolumeSpec{
			Source: &src,
			Storage: &cdiv1.StorageSpec{Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			}},
		},
	}
}

func statusMessage(err error) string {
	var se *apierrors.StatusError
	if errors.As(err, &se) {
		return se.ErrStatus.Message
	}
	if err == nil {
		return ""
	}
	return err.Error()
}

func testWebhooks(t *testing.T, e *aggEnv) {
	rs := e.startServer(t, true)
	ctx := context.Background()
	const label = "kubefill-webhook-test"
	registerWebhooks(t, e, rs, label)

	src := e.labelledNamespace(t, "clone-src-", label)
	dst := e.labelledNamespace(t, "clone-dst-", label)
	if err := e.client.Create(ctx, newClaim(src, "golden", nil)); err != nil {
		t.Fatal(err)
	}
	dvRule := rbacv1.PolicyRule{APIGroups: []string{cdiv1.GroupName}, Resources: []string{"datavolumes"}, Verbs: []string{"create", "get", "update"}}
	// alice: explicit permission on the source; carol: the implicit rule
	// (create pods there); bob: nothing in the source namespace.
	for _, u := range []string{"alice", "bob", "carol"} {
		grantRole(t, e, dst, u, dvRule)
	}
	grantRole(t, e, src, "alice", rbacv1.PolicyRule{APIGroups: []string{cdiv1.GroupName}, Resources: []string{"datavolumes/source"}, Verbs: []string{"create"}})
	grantRole(t, e, src, "carol", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create"}})
	alice, bob, carol := e.userClient(t, "alice"), e.userClient(t, "bob"), e.userClient(t, "carol")

	// Wait until the webhook configuration is in effect: an invalid checksum
	// passes the CRD's schema and CEL, so only our webhook can deny it.
	badChecksum := func(name string) *cdiv1.DataVolume {
		return storageDV(dst, name, cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://images.example/disk.qcow2", Checksum: "sha256:nothex"}})
	}
	var err error
	probes := 0
	took := kit.Eventually(t, 60*time.Second, kit.Interval, "the webhook to be in effect", func() (bool, string, error) {
		err = e.client.Create(ctx, badChecksum(fmt.Sprintf("probe-%d", probes)))
		probes++
		return err != nil, fmt.Sprintf("%d DataVolumes with a bad checksum admitted", probes), nil
	})
	t.Logf("webhooks in effect after %s", took.Round(time.Millisecond))

	t.Run("invalid DataVolumes are denied with the field and reason", func(t *testing.T) {
		if !apierrors.IsInvalid(err) || !strings.Contains(statusMessage(err), "spec.source.http.checksum") {
			t.Fatalf("bad checksum: %v", err)
		}
		noModes := storageDV(dst, "no-access-modes", cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}})
		noModes.Spec.Storage = nil
		noModes.Spec.PVC = &corev1.PersistentVolumeClaimSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}
		err := e.client.Create(ctx, noModes)
		if !apierrors.IsInvalid(err) || !strings.Contains(statusMessage(err), "spec.pvc.accessModes") {
			t.Fatalf("pvc without access modes: %v", err)
		}
		noSize := storageDV(dst, "no-size", cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}})
		noSize.Spec.Storage.Resources = corev1.VolumeResourceRequirements{}
		err = e.client.Create(ctx, noSize)
		if !apierrors.IsInvalid(err) || !strings.Contains(statusMessage(err), "spec.storage.resources.requests.storage") {
			t.Fatalf("import without size: %v", err)
		}
		stream := "fedora"
		node := cdiv1.RegistryPullPod
		reg := storageDV(dst, "stream-by-pod", cdiv1.DataVolumeSource{Registry: &cdiv1.DataVolumeSourceRegistry{ImageStream: &stream, PullMethod: &node}})
		err = e.client.Create(ctx, reg)
		if !apierrors.IsInvalid(err) || !strings.Contains(statusMessage(err), "imageStream works only with pullMethod node") {
			t.Fatalf("imageStream with pod pull: %v", err)
		}
	})

	t.Run("a valid DataVolume is admitted and its spec is then immutable", func(t *testing.T) {
		dv := storageDV(dst, "blank", cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}})
		if err := e.client.Create(ctx, dv); err != nil {
			t.Fatalf("valid blank DataVolume denied: %v", err)
		}
		if _, ok := dv.Annotations[cdiv1.AnnCloneToken]; ok {
			t.Fatal("a non-clone DataVolume got a clone token")
		}
		dv.Spec.Storage.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("2Gi")
		err := e.client.Update(ctx, dv)
		if err == nil || !strings.Contains(statusMessage(err), "cannot change after creation") {
			t.Fatalf("spec update: %v", err)
		}
		// Metadata changes remain possible.
		dv.Spec.Storage.Resources.Requests[corev1.ResourceStorage] = resource.MustParse("1Gi")
		dv.Labels = map[string]string{"tier": "gold"}
		if err := e.client.Update(ctx, dv); err != nil {
			t.Fatalf("label update: %v", err)
		}
	})

	ks := rs.signingKeys(t, e.client)
	validator := token.NewValidator(token.CloneTokenIssuer, ks.Current, token.DefaultCloneTokenLeeway)
	cloneDV := func(name string) *cdiv1.DataVolume {
		return storageDV(dst, name, cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: src, Name: "golden"}})
	}

	t.Run("a cross-namespace clone by a user with datavolumes/source gets a clone token", func(t *testing.T) {
		dv := cloneDV("by-alice")
		begin := time.Now()
		if err := alice.Create(ctx, dv); err != nil {
			t.Fatalf("alice's clone denied: %v", err)
		}
		t.Logf("create with mutation+validation took %s", time.Since(begin).Round(time.Millisecond))
		tok := dv.Annotations[cdiv1.AnnCloneToken]
		if tok == "" {
			t.Fatalf("no %s annotation on %v", cdiv1.AnnCloneToken, dv.Annotations)
		}
		p, err := validator.Validate(tok)
		if err != nil {
			t.Fatalf("clone token does not validate: %v", err)
		}
		if err := token.CheckClone(p, token.ResourcePVC, src, "golden", dst, "by-alice"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("the implicit rule (create pods in the source namespace) also allows the clone", func(t *testing.T) {
		dv := cloneDV("by-carol")
		if err := carol.Create(ctx, dv); err != nil {
			t.Fatalf("carol's clone denied: %v", err)
		}
		if dv.Annotations[cdiv1.AnnCloneToken] == "" {
			t.Fatal("no clone token")
		}
	})

	t.Run("a sourceRef DataSource in the source namespace is resolved and authorised", func(t *testing.T) {
		ds := &cdiv1.DataSource{
			ObjectMeta: metav1.ObjectMeta{Namespace: src, Name: "fedora"},
			Spec:       cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: src, Name: "golden"}}},
		}
		if err := e.client.Create(ctx, ds); err != nil {
			t.Fatal(err)
		}
		dv := storageDV(dst, "from-datasource", cdiv1.DataVolumeSource{})
		dv.Spec.Source, dv.Spec.SourceRef = nil, &cdiv1.DataVolumeSourceRef{Kind: "DataSource", Namespace: &src, Name: "fedora"}
		if err := alice.Create(ctx, dv); err != nil {
			t.Fatalf("alice's sourceRef clone: %v", err)
		}
		p, err := validator.Validate(dv.Annotations[cdiv1.AnnCloneToken])
		if err != nil {
			t.Fatal(err)
		}
		if err := token.CheckClone(p, token.ResourcePVC, src, "golden", dst, "from-datasource"); err != nil {
			t.Fatal(err)
		}
		dv = storageDV(dst, "from-datasource-bob", cdiv1.DataVolumeSource{})
		dv.Spec.Source, dv.Spec.SourceRef = nil, &cdiv1.DataVolumeSourceRef{Kind: "DataSource", Namespace: &src, Name: "fedora"}
		if err := bob.Create(ctx, dv); !apierrors.IsForbidden(err) {
			t.Fatalf("bob's sourceRef clone: %v", err)
		}
	})

	t.Run("a user without permission in the source namespace is denied with the missing permission", func(t *testing.T) {
		err := bob.Create(ctx, cloneDV("by-bob"))
		if !apierrors.IsForbidden(err) {
			t.Fatalf("bob's clone: %v", err)
		}
		msg := statusMessage(err)
		if !strings.Contains(msg, `user "bob"`) || !strings.Contains(msg, "datavolumes/source") || !strings.Contains(msg, src) {
			t.Fatalf("message does not name the missing permission: %s", msg)
		}
	})

	t.Run("a user-supplied clone token is replaced by ours", func(t *testing.T) {
		dv := cloneDV("forged")
		dv.Annotations = map[string]string{cdiv1.AnnCloneToken: "forged-token"}
		if err := alice.Create(ctx, dv); err != nil {
			t.Fatal(err)
		}
		if tok := dv.Annotations[cdiv1.AnnCloneToken]; tok == "forged-token" {
			t.Fatal("forged token kept")
		} else if _, err := validator.Validate(tok); err != nil {
			t.Fatalf("replacement token invalid: %v", err)
		}
	})

	t.Run("populator sources are validated", func(t *testing.T) {
		secretKind := &cdiv1.VolumeCloneSource{
			ObjectMeta: metav1.ObjectMeta{Namespace: dst, Name: "bad-kind"},
			Spec:       cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{Kind: "Secret", Name: "x"}},
		}
		err := e.client.Create(ctx, secretKind)
		if !apierrors.IsInvalid(err) || !strings.Contains(statusMessage(err), "PersistentVolumeClaim") {
			t.Fatalf("clone source of kind Secret: %v", err)
		}
		good := &cdiv1.VolumeCloneSource{
			ObjectMeta: metav1.ObjectMeta{Namespace: dst, Name: "good"},
			Spec:       cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "golden"}},
		}
		if err := e.client.Create(ctx, good); err != nil {
			t.Fatalf("valid clone source denied: %v", err)
		}
		imp := &cdiv1.VolumeImportSource{
			ObjectMeta: metav1.ObjectMeta{Namespace: dst, Name: "bad-url"},
			Spec:       cdiv1.VolumeImportSourceSpec{Source: &cdiv1.ImportSourceType{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "ftp://old.example/disk.img"}}},
		}
		err = e.client.Create(ctx, imp)
		if !apierrors.IsInvalid(err) || !strings.Contains(statusMessage(err), "spec.source.http.url") {
			t.Fatalf("import source with ftp url: %v", err)
		}
		imp.Name, imp.Spec.Source.HTTP.URL = "good-url", "https://images.example/disk.img"
		if err := e.client.Create(ctx, imp); err != nil {
			t.Fatalf("valid import source denied: %v", err)
		}
		imp.Spec.Source.HTTP.URL = "https://images.example/other.img"
		if err := e.client.Update(ctx, imp); err == nil || !strings.Contains(statusMessage(err), "cannot change after creation") {
			t.Fatalf("import source spec update: %v", err)
		}
	})
}
