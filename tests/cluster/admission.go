package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/apiserver/admission"
	"github.com/kubefill/kubefill/pkg/pki"
	"github.com/kubefill/kubefill/pkg/token"
)

// Admission is `kubefill apiserver` serving Kubefill's admission webhooks
// (the DataVolume mutating webhook that authorises a clone for the user who
// asks and adds its token, and the DataVolume and populator validating
// webhooks), run from this checkout as one of the cluster's processes and
// registered with kube-apiserver for the namespaces labelled
// NamespaceLabel=true only: the rest of the cluster's DataVolumes never
// depend on it, and several can run one after another.
type Admission struct {
	// NamespaceLabel is the label (value "true") a namespace needs for the
	// webhooks to see its objects.
	NamespaceLabel string
	// InstallNamespace holds the token signing key Secret the server made.
	InstallNamespace string
	// SigningKeyDir holds the public half of the token signing key (the
	// Secret's *.pub and rotated-at keys), as a controller Deployment mounts
	// it to validate clone tokens.
	SigningKeyDir string
	// URL is the server's base URL, on the host's loopback.
	URL string

	c      *Cluster
	rec    procRecord
	hooks  []string
	mhooks []string
}

// PID is the server's process ID.
func (a *Admission) PID() int { return a.rec.PID }

// StartAdmission runs `kubefill apiserver` with its webhooks for installNS
// (where it keeps the signing key Secret), waits until it answers, writes
// the signing key's public half to SigningKeyDir, and registers the
// webhooks for namespaces labelled label=true, with failurePolicy Fail as
// the install manifests have. extraArgs go to the server (for example
// --clone-token-lifetime=5s).
func (c *Cluster) StartAdmission(ctx context.Context, installNS, label string, extraArgs ...string) (*Admission, error) {
	t0 := time.Now()
	if c.kubefillBin == "" {
		return nil, errors.New("the kubefill binary did not build (the cluster needs a node)")
	}
	dir := filepath.Join(c.Dir, "kubefill", "admission-"+installNS)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	sc, err := pki.GenerateServingCert("kubefill-admission", []string{"localhost", "127.0.0.1"}, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := writeFiles(map[string][]byte{certFile: sc.CertPEM, keyFile: sc.KeyPEM}); err != nil {
		return nil, err
	}
	args := append([]string{"apiserver",
		"--kubeconfig=" + c.Kubeconfig,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + certFile,
		"--tls-private-key-file=" + keyFile,
		"--install-namespace=" + installNS,
		// The harness's controller (startKubefill, and the e2e tests' in
		// process) runs as the admin, not as the kubefill-controller
		// ServiceAccount: the identity that may change a DataVolume's
		// extended clone token. extraArgs may say otherwise.
		"--controller-user=" + AdminUser,
	}, extraArgs...)
	rec, err := c.run("kubefill-admission-"+installNS, nil, c.kubefillBin, args...)
	if err != nil {
		return nil, err
	}
	a := &Admission{NamespaceLabel: label, InstallNamespace: installNS, URL: "https://127.0.0.1:" + strconv.Itoa(port), c: c, rec: rec,
		SigningKeyDir: filepath.Join(dir, "signing-key")}
	fail := func(err error) (*Admission, error) { return nil, errors.Join(err, a.Stop()) }
	if err := waitHealthy(ctx, a.URL+"/healthz", sc.CAPEM, rec); err != nil {
		return fail(fmt.Errorf("kubefill apiserver (admission): %w", err))
	}
	if err := c.writeSecretFiles(ctx, installNS, token.DefaultSigningKeySecretName, a.SigningKeyDir,
		func(k string) bool { return strings.HasSuffix(k, ".pub") || k == "rotated-at" }); err != nil {
		return fail(err)
	}
	vwc, mwc := AdmissionWebhooks(a.URL, sc.CAPEM, label)
	if _, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, vwc, metav1.CreateOptions{}); err != nil {
		return fail(fmt.Errorf("registering %s: %w", vwc.Name, err))
	}
	a.hooks = append(a.hooks, vwc.Name)
	if _, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, mwc, metav1.CreateOptions{}); err != nil {
		return fail(fmt.Errorf("registering %s: %w", mwc.Name, err))
	}
	a.mhooks = append(a.mhooks, mwc.Name)
	c.opts.Logf("cluster: admission webhooks at %s for namespaces labelled %s=true (%s)", a.URL, label, time.Since(t0).Round(time.Millisecond))
	return a, nil
}

// Stop removes the webhook configurations and ends the server.
func (a *Admission) Stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for _, n := range a.hooks {
		if err := a.c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	for _, n := range a.mhooks {
		if err := a.c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, n, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	a.hooks, a.mhooks = nil, nil
	return errors.Join(append(errs, a.rec.stop(10*time.Second))...)
}

// AdmissionWebhooks are the webhook configurations of manifests/install/
// webhooks.yaml (same webhook names, paths, rules and failure policy),
// pointed at a server at baseURL trusting caPEM, and limited to namespaces
// labelled label=true.
func AdmissionWebhooks(baseURL string, caPEM []byte, label string) (*admissionregistrationv1.ValidatingWebhookConfiguration, *admissionregistrationv1.MutatingWebhookConfiguration) {
	failPolicy := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	never := admissionregistrationv1.NeverReinvocationPolicy
	timeout := int32(10)
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{label: "true"}}
	cfg := func(path string) admissionregistrationv1.WebhookClientConfig {
		u := baseURL + path
		return admissionregistrationv1.WebhookClientConfig{URL: &u, CABundle: caPEM}
	}
	rule := func(resources []string, ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
		scope := admissionregistrationv1.NamespacedScope
		return []admissionregistrationv1.RuleWithOperations{{
			Operations: ops,
			Rule:       admissionregistrationv1.Rule{APIGroups: []string{cdiv1.GroupName}, APIVersions: []string{"v1beta1"}, Resources: resources, Scope: &scope},
		}}
	}
	create, update := admissionregistrationv1.Create, admissionregistrationv1.Update
	vwc := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kubefill-validate-" + label},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{Name: "datavolume-validate.cdi.kubevirt.io", ClientConfig: cfg(admission.PathDataVolumeValidate),
				Rules:         rule([]string{"datavolumes"}, create, update),
				FailurePolicy: &failPolicy, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: sel, TimeoutSeconds: &timeout},
			{Name: "populator-validate.cdi.kubevirt.io", ClientConfig: cfg(admission.PathPopulatorValidate),
				Rules:         rule([]string{"volumeimportsources", "volumeuploadsources", "volumeclonesources"}, create, update),
				FailurePolicy: &failPolicy, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: sel, TimeoutSeconds: &timeout},
			{Name: "dataimportcron-validate.cdi.kubevirt.io", ClientConfig: cfg(admission.PathDataImportCronValidate),
				Rules:         rule([]string{"dataimportcrons"}, create, update),
				FailurePolicy: &failPolicy, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: sel, TimeoutSeconds: &timeout},
		},
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "kubefill-mutate-" + label},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			{Name: "datavolume-mutate.cdi.kubevirt.io", ClientConfig: cfg(admission.PathDataVolumeMutate),
				Rules:         rule([]string{"datavolumes"}, create),
				FailurePolicy: &failPolicy, SideEffects: &none, AdmissionReviewVersions: []string{"v1"}, NamespaceSelector: sel,
				TimeoutSeconds: &timeout, ReinvocationPolicy: &never},
		},
	}
	return vwc, mwc
}
