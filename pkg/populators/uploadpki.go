package populators

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/certs"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/pki"
)

// Secrets and names the upload flow shares with the upload proxy: CDI's
// upload chains (pkg/certs), kept and rotated by the certificate
// controller in the controller's install namespace. Only the per-pod
// serving Secret sits next to its upload pod.
const (
	// UploadServerCASecret is the upload-server signer (tls.crt, tls.key),
	// which signs each upload pod's serving certificate. Its bundle
	// ConfigMap (certs.BundleName) holds every still-valid CA of the chain.
	UploadServerCASecret = certs.UploadServerSigner
	// UploadProxyClientCASecret is the upload-server client signer, the CA
	// of the certificates upload servers accept.
	UploadProxyClientCASecret = certs.UploadServerClientSigner
	// UploadProxyClientSecret is the upload proxy's client certificate:
	// tls.crt and tls.key (common name UploadProxyClientName), plus ca.crt,
	// the upload-server signer's bundle to verify upload pods with.
	UploadProxyClientSecret = certs.UploadServerClientCert
	// UploadProxyClientName is the common name upload servers require of
	// the proxy, CDI's.
	UploadProxyClientName = certs.UploadServerClientName
	// UploadServerPort is the upload server's TLS port in the pod; its
	// Service listens on contract.UploadServicePort.
	UploadServerPort = contract.UploadServerPort
	// LabelUploadTarget on an upload pod names its prime (see
	// uploadTargetLabel); the pod's Service selects on it.
	LabelUploadTarget = "kubefill.io/upload-target"
)

// UploadServiceName is the name of the Service, and of the serving
// certificate's Secret, of the upload pod that serves prime (a prime, or a
// claim filled in place): always a DNS-1035 label, the one name the upload
// proxy also computes (cdiv1.UploadServiceName).
func UploadServiceName(prime *corev1.PersistentVolumeClaim) string {
	return cdiv1.UploadServiceName(prime.Name)
}

// uploadTargetLabel is the LabelUploadTarget value of prime's upload pod
// and its Service's selector: the prime's name, which every prime has
// carried, when it is a label value (at most 63 characters), else the
// Service's name (a claim filled in place may have a longer name). Pure.
func uploadTargetLabel(prime *corev1.PersistentVolumeClaim) string {
	if len(validation.IsValidLabelValue(prime.Name)) == 0 {
		return prime.Name
	}
	return UploadServiceName(prime)
}

// LoadUploadPKI returns the upload chains of the install namespace,
// creating any that is missing (an upload may come before the certificate
// controller's first pass); it never rotates them.
func LoadUploadPKI(ctx context.Context, c client.Client, r client.Reader, namespace string) (*certs.UploadChains, error) {
	if namespace == "" {
		return nil, fmt.Errorf("the controller's install namespace is not set (POD_NAMESPACE)")
	}
	store := &certs.Store{Client: c, Reader: r, Namespace: namespace}
	return store.EnsureUploadChains(ctx, time.Now())
}

// EnsureUploadPKI makes sure the upload-server signer, the client signer,
// their bundles and the proxy's client certificate exist, and returns both
// signers' CAs.
func EnsureUploadPKI(ctx context.Context, c client.Client, r client.Reader, namespace string) (serverCA, clientCA *pki.CA, err error) {
	u, err := LoadUploadPKI(ctx, c, r, namespace)
	if err != nil {
		return nil, nil, err
	}
	return u.ServerSigner.CA, u.ClientSigner.CA, nil
}

// ensureServing creates the upload pod's serving Secret and its Service,
// both named UploadServiceName. The certificate's names come from that name
// alone, never from the claim's: <service>.<namespace>.svc (its common name)
// and <service>.<namespace>.svc.cluster.local, the names of a Service of
// the prime's namespace and nothing else.
func (p *UploadServing) ensureServing(ctx context.Context, target, prime *corev1.PersistentVolumeClaim) error {
	k := p
	name := UploadServiceName(prime)
	s := &corev1.Secret{}
	err := k.reader().Get(ctx, types.NamespacedName{Namespace: prime.Namespace, Name: name}, s)
	if apierrors.IsNotFound(err) {
		u, err := LoadUploadPKI(ctx, k.Client, k.reader(), k.Namespace)
		if err != nil {
			return err
		}
		// Valid as long as the signer is: the proxy trusts the signer's
		// bundle, which keeps it until it expires.
		hosts := UploadServingHosts(name, prime.Namespace)
		now := time.Now()
		crt, key, err := u.ServerSigner.CA.Issue(hosts[0], hosts, false, certs.LeafValidity(u.ServerSigner, uploadServerValidity, now))
		if err != nil {
			return err
		}
		// client-ca.crt is the one signer whose clients this server takes,
		// its whole bundle, so that a client certificate of a rotated signer
		// is accepted too: the upload proxy's signer for an upload, the clone
		// signer for a clone's upload server (never both).
		clientBundle := u.ClientBundle
		if p.CloneClients {
			clientBundle = u.CloneBundle
		}
		s = &corev1.Secret{
			ObjectMeta: servingMeta(name, target, prime),
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key, UploadClientCAKey: clientBundle},
		}
		if err := k.Client.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating upload Secret %s: %w", name, err)
		}
	} else if err != nil {
		return fmt.Errorf("reading upload Secret %s: %w", name, err)
	}
	svc := &corev1.Service{
		ObjectMeta: servingMeta(name, target, prime),
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{LabelUploadTarget: uploadTargetLabel(prime)},
			Ports: []corev1.ServicePort{{Name: "uploadserver", Protocol: corev1.ProtocolTCP, Port: contract.UploadServicePort,
				TargetPort: intstr.FromInt32(contract.UploadServerPort)}},
			PublishNotReadyAddresses: p.PublishNotReady,
		},
	}
	if err := k.Client.Create(ctx, svc); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating upload Service %s: %w", name, err)
	}
	return nil
}

// UploadClientCAKey in the upload pod's serving Secret is the bundle of the
// CA its clients' certificates must chain to.
const UploadClientCAKey = "client-ca.crt"

// UploadServingHosts are the names on the serving certificate of the upload
// Service service in namespace: <service>.<namespace>.svc first (its common
// name, what the upload proxy and a clone's source pod verify), then the
// same under cluster.local. Pure.
func UploadServingHosts(service, namespace string) []string {
	host := service + "." + namespace + ".svc"
	return []string{host, host + ".cluster.local"}
}

// uploadServerValidity bounds an upload pod's serving certificate; it is
// cut to the signer's remaining validity.
const uploadServerValidity = 48 * time.Hour

// servingMeta is the metadata of an object serving target's upload pod.
func servingMeta(name string, target, prime *corev1.PersistentVolumeClaim) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: prime.Namespace, Labels: workerLabels(target, "upload-server"), OwnerReferences: ownedBy(target, prime.Namespace)}
}
