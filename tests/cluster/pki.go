package cluster

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kubefill/kubefill/tests/kit"
)

// keyPair is a PEM certificate and key.
type keyPair struct {
	CertPEM []byte
	KeyPEM  []byte
}

func (kp keyPair) write(dir, name string) (certFile, keyFile string, err error) {
	certFile = filepath.Join(dir, name+".crt")
	keyFile = filepath.Join(dir, name+".key")
	if err := os.WriteFile(certFile, kp.CertPEM, 0o644); err != nil {
		return "", "", fmt.Errorf("write %s: %w", certFile, err)
	}
	if err := os.WriteFile(keyFile, kp.KeyPEM, 0o600); err != nil {
		return "", "", fmt.Errorf("write %s: %w", keyFile, err)
	}
	return certFile, keyFile, nil
}

// writeServiceAccountKeys writes the RSA key pair that kube-apiserver signs
// and verifies service-account tokens with, and kube-controller-manager signs
// its tokens with.
func writeServiceAccountKeys(dir string) (pubFile, keyFile string, err error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", fmt.Errorf("generate service-account key: %w", err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return "", "", fmt.Errorf("marshal service-account public key: %w", err)
	}
	pubFile = filepath.Join(dir, "sa.pub")
	keyFile = filepath.Join(dir, "sa.key")
	if err := os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		return "", "", fmt.Errorf("write %s: %w", pubFile, err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return "", "", fmt.Errorf("write %s: %w", keyFile, err)
	}
	return pubFile, keyFile, nil
}

// caValidity is how long the cluster's CAs last.
const caValidity = 10 * 365 * 24 * time.Hour

// issue has ca sign the certificate l describes, valid for a year.
func issue(ca *kit.CA, l kit.Leaf) (keyPair, error) {
	certPEM, keyPEM, err := ca.Issue(l)
	if err != nil {
		return keyPair{}, fmt.Errorf("issue certificate for %q: %w", l.CommonName, err)
	}
	return keyPair{CertPEM: certPEM, KeyPEM: keyPEM}, nil
}

// WebhookClientName is the common name of the client certificate
// kube-apiserver presents to Kubefill's admission webhooks, issued by the
// cluster CA (kube-apiserver's client CA, which it publishes in
// kube-system/extension-apiserver-authentication): what `kubefill
// apiserver --webhook-client-names` admits. It authenticates to
// kube-apiserver as a user with no RBAC binding.
const WebhookClientName = "kube-apiserver-webhook-client"

// WebhookServer is the webhook server, as kube-apiserver names a Service
// it calls, for which it presents WebhookClientName: the kubefill-api
// Service of manifests/install.
const WebhookServer = "kubefill-api." + KubefillNamespace + ".svc"

// writeAdmissionConfig issues kube-apiserver's webhook client certificate
// and writes the AdmissionConfiguration (--admission-control-config-file)
// whose webhook kubeconfig presents it to WebhookServer, for both the
// mutating and the validating admission plugins. Other webhooks get no
// certificate, as before.
func writeAdmissionConfig(p *clusterPKI) (string, error) {
	kp, err := issue(p.ca, kit.Leaf{CommonName: WebhookClientName, Client: true})
	if err != nil {
		return "", err
	}
	certFile, keyFile, err := kp.write(p.dir, "apiserver-webhook-client")
	if err != nil {
		return "", err
	}
	kc := clientcmdapi.NewConfig()
	kc.AuthInfos[WebhookServer] = &clientcmdapi.AuthInfo{ClientCertificate: certFile, ClientKey: keyFile}
	kubeconfig := filepath.Join(p.dir, "admission-webhooks.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		return "", fmt.Errorf("write %s: %w", kubeconfig, err)
	}
	cfg := fmt.Sprintf(`apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: ValidatingAdmissionWebhook
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: WebhookAdmissionConfiguration
      kubeConfigFile: %[1]q
  - name: MutatingAdmissionWebhook
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: WebhookAdmissionConfiguration
      kubeConfigFile: %[1]q
`, kubeconfig)
	path := filepath.Join(p.dir, "admission-config.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return path, nil
}
