package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/apiserver/admission"
	"github.com/kubefill/kubefill/pkg/controller"
	"github.com/kubefill/kubefill/pkg/token"
	"github.com/kubefill/kubefill/tests/kit"
)

// webhookClientCN is the common name of the client certificate this test's
// kube-apiserver presents to the webhooks (--webhook-client-names).
const webhookClientCN = "kube-apiserver-webhook-client"

// TestWebhookTokenIsolation is H2 of the tenant-isolation review on a real
// kube-apiserver: the admission webhooks answer anyone who reaches them
// unless caller authentication is on, and the clone token a forged review
// gets back must be worth nothing. Its control plane presents a client
// certificate (from the request-header CA, with a CN that is no front
// proxy's) to a webhook server at an address reserved before it starts,
// through an AdmissionConfiguration, as docs/install.md tells an admin.
func TestWebhookTokenIsolation(t *testing.T) {
	var authLn net.Listener
	var apiserverCert tls.Certificate
	e := startAggEnvWith(t, func(e *aggEnv, args *envtest.Arguments, dir string) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ln.Close() })
		authLn = ln
		var certPEM, keyPEM []byte
		apiserverCert, certPEM, keyPEM = e.frontProxy.ClientCert(t, webhookClientCN)
		args.Set("admission-control-config-file", writeWebhookAdmissionConfig(t, dir, ln.Addr().String(), certPEM, keyPEM))
	})
	useControlPlane(t, e.cfg, e.client)
	t.Run("webhook caller authentication", func(t *testing.T) { testWebhookClientAuth(t, e, authLn, apiserverCert) })
	t.Run("a forged review's clone token cannot be planted", func(t *testing.T) { testForgedReviewToken(t, e) })
}

// writeWebhookAdmissionConfig writes the AdmissionConfiguration whose
// webhook kubeconfig presents certPEM to the webhook server at hostPort.
func writeWebhookAdmissionConfig(t *testing.T, dir, hostPort string, certPEM, keyPEM []byte) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.AuthInfos[hostPort] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	kubeconfig := filepath.Join(dir, "webhook-kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	plugin := func(name string) string {
		return fmt.Sprintf("  - name: %s\n    configuration:\n      apiVersion: apiserver.config.k8s.io/v1\n      kind: WebhookAdmissionConfiguration\n      kubeConfigFile: %q\n", name, kubeconfig)
	}
	cfg := "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n" + plugin("ValidatingAdmissionWebhook") + plugin("MutatingAdmissionWebhook")
	path := filepath.Join(dir, "admission-config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// forgedReview is an AdmissionReview for a DataVolume ns/name cloning
// srcNS/src, claiming to come from system:admin in system:masters: what
// anyone who reaches the webhook port can send.
func forgedReview(t *testing.T, ns, name, srcNS, src string) []byte {
	t.Helper()
	dv := storageDV(ns, name, cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: srcNS, Name: src}})
	dv.TypeMeta = metav1.TypeMeta{APIVersion: cdiv1.SchemeGroupVersion.String(), Kind: "DataVolume"}
	raw, err := json.Marshal(dv)
	if err != nil {
		t.Fatal(err)
	}
	review := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID:       types.UID("forged-" + name),
			Kind:      metav1.GroupVersionKind{Group: cdiv1.GroupName, Version: "v1beta1", Kind: "DataVolume"},
			Resource:  metav1.GroupVersionResource{Group: cdiv1.GroupName, Version: "v1beta1", Resource: "datavolumes"},
			Namespace: ns, Name: name, Operation: admissionv1.Create,
			UserInfo: authenticationv1.UserInfo{Username: "system:admin", Groups: []string{"system:masters", "system:authenticated"}},
			Object:   runtime.RawExtension{Raw: raw},
		},
	}
	body, err := json.Marshal(review)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// postReview POSTs body to the webhook path of rs, presenting cert (none if nil).
func postReview(t *testing.T, rs *runningServer, cert *tls.Certificate, path string, body []byte) (int, []byte) {
	t.Helper()
	resp, err := rs.httpClient(t, cert).Post("https://"+rs.addr+path, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// tokenFromReviewResponse is the clone token a mutating webhook's answer
// sets, or "".
func tokenFromReviewResponse(t *testing.T, body []byte) string {
	t.Helper()
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Response == nil {
		t.Fatalf("not an AdmissionReview response: %s", body)
	}
	var ops []struct {
		Op, Path string
		Value    any
	}
	if err := json.Unmarshal(review.Response.Patch, &ops); err != nil {
		t.Fatalf("patch %s: %v", review.Response.Patch, err)
	}
	for _, op := range ops {
		switch v := op.Value.(type) {
		case string:
			if strings.HasSuffix(op.Path, "storage.clone.token") {
				return v
			}
		case map[string]any:
			if s, ok := v[cdiv1.AnnCloneToken].(string); ok {
				return s
			}
		}
	}
	return ""
}

// testWebhookClientAuth: with --webhook-client-names, every webhook path
// answers 401 to a caller without a client certificate of the
// authentication ConfigMap's CAs (the forged review is never decoded) and
// 403 to one whose name is not listed, users' and the front proxy's
// included; kube-apiserver, presenting its certificate, is answered.
func testWebhookClientAuth(t *testing.T, e *aggEnv, ln net.Listener, apiserverCert tls.Certificate) {
	ctx := context.Background()
	rs := e.startServerWith(t, true, serverOptions{listener: ln, webhookClientNames: []string{webhookClientCN}})
	const label = "kubefill-webhook-clientauth"
	registerWebhooks(t, e, rs, label)
	src := e.labelledNamespace(t, "clientauth-src-", label)
	dst := e.labelledNamespace(t, "clientauth-dst-", label)
	mustCreate(t, e.client, newClaim(src, "golden", nil))

	// kube-apiserver's calls are answered: our validation's denial (not
	// "failed calling webhook") and our mutation's token come back.
	var err error
	probes := 0
	kit.Eventually(t, 60*time.Second, kit.Interval, "the webhooks to be in effect", func() (bool, string, error) {
		err = e.client.Create(ctx, storageDV(dst, fmt.Sprintf("probe-%d", probes), cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: "https://images.example/d.qcow2", Checksum: "sha256:nothex"}}))
		probes++
		return err != nil && !strings.Contains(err.Error(), "failed calling webhook"), statusMessage(err), nil
	})
	if !apierrors.IsInvalid(err) || !strings.Contains(statusMessage(err), "spec.source.http.checksum") {
		t.Fatalf("kube-apiserver's call to the validating webhook: %v", err)
	}
	dv := storageDV(dst, "by-admin", cdiv1.DataVolumeSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: src, Name: "golden"}})
	if err := e.client.Create(ctx, dv); err != nil {
		t.Fatalf("kube-apiserver's call to the mutating webhook: %v", err)
	}
	if dv.Annotations[cdiv1.AnnCloneToken] == "" {
		t.Fatal("the mutating webhook, called by kube-apiserver, added no clone token")
	}

	forged := forgedReview(t, dst, "t-oracle", src, "golden")
	userCfg := e.userConfig(t, "system:admin", "system:masters")
	userCert, err := tls.X509KeyPair(userCfg.CertData, userCfg.KeyData)
	if err != nil {
		t.Fatal(err)
	}
	rogueCert, _, _ := kit.TestCA(t, "rogue-ca").ClientCert(t, webhookClientCN)
	paths := []string{admission.PathDataVolumeMutate, admission.PathDataVolumeValidate, admission.PathPopulatorValidate,
		admission.PathCDIValidate, admission.PathDataImportCronValidate}
	for _, c := range []struct {
		name string
		cert *tls.Certificate
		code int
	}{
		{"no client certificate", nil, http.StatusUnauthorized},
		{"a certificate with kube-apiserver's name from another CA", &rogueCert, http.StatusUnauthorized},
		{"a cluster-admin user's certificate", &userCert, http.StatusForbidden},
		{"the front proxy's certificate", &e.proxyCert, http.StatusForbidden},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, path := range paths {
				code, body := postReview(t, rs, c.cert, path, forged)
				if code != c.code || !strings.Contains(string(body), "webhook caller refused") || strings.Contains(string(body), "AdmissionReview") {
					t.Errorf("%s: %d %s, want %d and no review", path, code, body, c.code)
				}
			}
		})
	}
	// kube-apiserver's own certificate is answered (and only its holder has the key).
	code, body := postReview(t, rs, &apiserverCert, admission.PathDataVolumeMutate, forged)
	if code != http.StatusOK || tokenFromReviewResponse(t, body) == "" {
		t.Errorf("kube-apiserver's certificate: %d %s", code, body)
	}
}

// testForgedReviewToken: with caller authentication off (the default, as
// on a CDI cluster), the mutating webhook answers a forged review claiming
// system:masters with a signed clone token for another tenant's claim. It
// is worth nothing: the webhook replaces it on a DataVolume created with
// it, refuses it on one already admitted, and the clone populator refuses
// it on a bare claim, reading nothing in the victim's namespace. And a
// sourceRef DataSource re-pointed after admission at the victim's claim is
// authorised again, for the user who created the DataVolume, and refused
// naming the permission; re-pointed at one of her own, the clone goes on.
func testForgedReviewToken(t *testing.T, e *aggEnv) {
	ctx := context.Background()
	const controllerUser = "kubefill-controller-test"
	rs := e.startServerWith(t, true, serverOptions{controllerUser: controllerUser})
	const label = "kubefill-webhook-forged"
	registerWebhooks(t, e, rs, label)
	victim := e.labelledNamespace(t, "victim-", label)
	tenant := e.labelledNamespace(t, "tenant-", label)
	class := tenant + "-csi"
	csiClass(t, class, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	boundSource(t, victim, "secret-disk", class, "1Gi")
	boundSource(t, tenant, "own", class, "1Gi")

	// mallory may do in her namespace what edit allows, and nothing in the victim's.
	grantRole(t, e, tenant, "mallory",
		rbacv1.PolicyRule{APIGroups: []string{cdiv1.GroupName}, Resources: []string{"datavolumes", "datasources"}, Verbs: []string{"create", "get", "list", "update", "patch", "delete"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods", "persistentvolumeclaims"}, Verbs: []string{"create", "get", "list", "update", "patch", "delete"}})
	mallory := e.userClient(t, "mallory")

	// The controller, as the identity the validating webhook lets change extended tokens.
	mgr, err := controller.NewManager(e.userConfig(t, controllerUser, "system:masters"), controller.ManagerOptions{
		MetricsBindAddress: "0", HealthProbeBindAddress: "0", WorkerImage: "kubefill/kubefill:test",
		InstallNamespace: rs.namespace, SkipNameValidation: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	startUntilCleanup(t, mgr)

	// 1. The oracle: a forged review gets a valid token for the victim's claim.
	ks := rs.signingKeys(t, e.client)
	validator := token.NewValidator(token.CloneTokenIssuer, ks.Current, token.DefaultCloneTokenLeeway)
	oracle := func(name string) string {
		t.Helper()
		code, body := postReview(t, rs, nil, admission.PathDataVolumeMutate, forgedReview(t, tenant, name, victim, "secret-disk"))
		tok := tokenFromReviewResponse(t, body)
		if code != http.StatusOK || tok == "" {
			t.Fatalf("forged review: %d %s", code, body)
		}
		p, err := validator.Validate(tok)
		if err != nil {
			t.Fatal(err)
		}
		if err := token.CheckClone(p, token.ResourcePVC, victim, "secret-disk", tenant, name); err != nil || p.Requester.Username != "system:admin" {
			t.Fatalf("forged token %+v for %+v: %v", p, p.Requester, err)
		}
		return tok
	}
	forged := oracle("t-oracle")

	// 2. A DataVolume created with it: admitted for mallory, with a token of its own.
	ds := &cdiv1.DataSource{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "ds-oracle"},
		Spec: cdiv1.DataSourceSpec{Source: cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: tenant, Name: "not-yet"}}}}
	mustCreate(t, mallory, ds)
	dv := &cdiv1.DataVolume{ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: "t-oracle",
		Annotations: map[string]string{cdiv1.AnnCloneToken: forged, cdiv1.AnnExtendedCloneToken: forged}},
		Spec: cdiv1.DataVolumeSpec{SourceRef: &cdiv1.DataVolumeSourceRef{Kind: cdiv1.DataVolumeDataSource, Name: "ds-oracle"},
			Storage: &cdiv1.StorageSpec{StorageClassName: &class}}}
	if err := mallory.Create(ctx, dv); err != nil {
		t.Fatalf("mallory's DataVolume: %v", err)
	}
	own := dv.Annotations[cdiv1.AnnCloneToken]
	p, err := validator.Validate(own)
	if own == forged || err != nil || p.Requester.Username != "mallory" || p.Namespace != tenant || p.Name != "not-yet" {
		t.Fatalf("the DataVolume kept the forged token or got a wrong one: %+v (%v)", p, err)
	}
	if ext := dv.Annotations[cdiv1.AnnExtendedCloneToken]; ext == forged {
		t.Fatal("the forged extended token was admitted")
	}

	// 3. Planted on the admitted DataVolume: refused, whatever the key.
	kit.Until(t, 60*time.Second, "the controller's extended token on mallory's DataVolume", func() bool {
		return e.client.Get(ctx, client.ObjectKeyFromObject(dv), dv) == nil && dv.Annotations[cdiv1.AnnExtendedCloneToken] != ""
	})
	for key, want := range map[string]string{
		cdiv1.AnnCloneToken:         "set once, by the DataVolume webhook",
		cdiv1.AnnExtendedCloneToken: "only the Kubefill controller (" + controllerUser + ")",
	} {
		// As `kubectl annotate --overwrite` does: a merge patch.
		planted := dv.DeepCopy()
		planted.Annotations[key] = forged
		err := mallory.Patch(ctx, planted, client.MergeFrom(dv))
		if !apierrors.IsInvalid(err) || !strings.Contains(statusMessage(err), key) || !strings.Contains(statusMessage(err), want) {
			t.Errorf("planting the forged token as %s: %v", key, err)
		}
		removed := dv.DeepCopy()
		delete(removed.Annotations, key)
		if err := mallory.Patch(ctx, removed, client.MergeFrom(dv)); !apierrors.IsInvalid(err) {
			t.Errorf("removing %s: %v", key, err)
		}
	}

	// 4. On a bare claim, next to a VolumeCloneSource in the victim's namespace: refused before anything there is read.
	bareToken := oracle("bare-oracle")
	mustCreate(t, e.client, &cdiv1.VolumeCloneSource{ObjectMeta: metav1.ObjectMeta{Namespace: victim, Name: "vcs-victim"},
		Spec: cdiv1.VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "secret-disk"}}})
	bare := kit.PVC(tenant, "bare-oracle", "1Gi", kit.Class(class), kit.SourceRef(cdiv1.VolumeCloneSourceRef, "vcs-victim"),
		kit.Annotate(map[string]string{cdiv1.AnnDataSourceNamespace: victim, cdiv1.AnnCloneToken: bareToken}))
	mustCreate(t, mallory, bare)
	kit.Until(t, 60*time.Second, "the bare claim refused", func() bool {
		_ = e.client.Get(ctx, client.ObjectKeyFromObject(bare), bare)
		return bare.Annotations[cdiv1.AnnRunningConditionReason] == "SourceNotAuthorized"
	})
	if msg := bare.Annotations[cdiv1.AnnRunningConditionMessage]; !strings.Contains(msg, "is not accepted on a claim") || !strings.Contains(msg, victim) {
		t.Errorf("bare claim refused with %q", msg)
	}
	nothingInVictim := func(what string) {
		t.Helper()
		pods := &corev1.PodList{}
		claims := &corev1.PersistentVolumeClaimList{}
		if err := e.client.List(ctx, pods, client.InNamespace(victim)); err != nil {
			t.Fatal(err)
		}
		if err := e.client.List(ctx, claims, client.InNamespace(victim)); err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) > 0 || len(claims.Items) != 1 {
			t.Fatalf("%s: %d pods and %d claims in the victim's namespace, want none and its own", what, len(pods.Items), len(claims.Items))
		}
	}
	nothingInVictim("the bare claim")

	// 5. The DataSource re-pointed at the victim's claim: authorised again for mallory, refused.
	repoint := func(ns, name string) {
		t.Helper()
		if err := mallory.Get(ctx, client.ObjectKeyFromObject(ds), ds); err != nil {
			t.Fatal(err)
		}
		ds.Spec.Source.PVC = &cdiv1.DataVolumeSourcePVC{Namespace: ns, Name: name}
		if err := mallory.Update(ctx, ds); err != nil {
			t.Fatal(err)
		}
	}
	repoint(victim, "secret-disk")
	dv = waitRunning(t, tenant, "t-oracle", "now resolves to PersistentVolumeClaim "+victim+"/secret-disk")
	run := kit.DataVolumeCondition(dv, cdiv1.DataVolumeRunning)
	t.Logf("re-pointed at the victim: %s: %s", run.Reason, run.Message)
	for _, want := range []string{`user "mallory" may not clone PersistentVolumeClaim ` + victim + "/secret-disk", "datavolumes/source", `namespace "` + victim + `"`, "create pods"} {
		if !strings.Contains(run.Message, want) {
			t.Errorf("Running %q lacks %q", run.Message, want)
		}
	}
	if run.Reason != "SourceNotAuthorized" || !eventReasons(t, tenant, dv.UID)["SourceNotAuthorized"] {
		t.Errorf("Running reason %q; want SourceNotAuthorized and a Warning event", run.Reason)
	}
	if err := e.client.Get(ctx, types.NamespacedName{Namespace: tenant, Name: "t-oracle"}, &corev1.PersistentVolumeClaim{}); !apierrors.IsNotFound(err) {
		t.Errorf("a claim was made for the re-pointed DataVolume: %v", err)
	}
	nothingInVictim("the re-pointed DataSource")
	vcsList := &cdiv1.VolumeCloneSourceList{}
	if err := e.client.List(ctx, vcsList, client.InNamespace(victim)); err != nil || len(vcsList.Items) != 1 {
		t.Errorf("VolumeCloneSources in the victim's namespace: %d (%v), want only the test's own", len(vcsList.Items), err)
	}

	// 6. Re-pointed at a claim of her own: authorised again, the clone goes on from it.
	repoint(tenant, "own")
	pvc := waitClaim(t, tenant, "t-oracle", nil)
	vcs := &cdiv1.VolumeCloneSource{}
	if err := e.client.Get(ctx, types.NamespacedName{Namespace: tenant, Name: controller.CloneSourceName(dv)}, vcs); err != nil || vcs.Spec.Source.Name != "own" {
		t.Fatalf("VolumeCloneSource %+v (%v), want one naming %s/own", vcs.Spec, err, tenant)
	}
	if !eventReasons(t, tenant, dv.UID)["CloneSourceReauthorized"] {
		t.Error("no event saying the new source was authorised")
	}
	t.Logf("re-pointed at her own claim: claim %s made, cloning %s/%s", pvc.Name, vcs.Namespace, vcs.Spec.Source.Name)
}
