package populators

import (
	"bytes"
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/pki"
)

// Secrets and names the upload flow shares with the upload proxy. All the
// Secrets below live in the controller's install namespace, except the
// per-pod serving Secret, which sits next to its upload pod.
const (
	// UploadServerCASecret holds the CA (tls.crt, tls.key) that signs each
	// upload pod's serving certificate. The proxy trusts its tls.crt.
	UploadServerCASecret = "kubefill-upload-server-ca"
	// UploadProxyClientCASecret holds the CA (tls.crt, tls.key) of the
	// proxy's client certificates; upload servers accept only those.
	UploadProxyClientCASecret = "kubefill-uploadproxy-client-ca"
	// UploadProxyClientSecret is the proxy's client certificate: tls.crt and
	// tls.key (common name UploadProxyClientName), plus ca.crt, the upload
	// server CA to verify upload pods with.
	UploadProxyClientSecret = "kubefill-uploadproxy-client"
	// UploadProxyClientName is the common name upload servers require.
	UploadProxyClientName = "kubefill-uploadproxy"
	// UploadServerPort is the upload server's TLS port in the pod; its
	// Service listens on contract.UploadServicePort.
	UploadServerPort = contract.UploadServerPort
	// LabelUploadTarget on an upload pod names its prime; the pod's Service
	// selects on it.
	LabelUploadTarget = "kubefill.io/upload-target"
	caValidity        = 10 * 365 * 24 * time.Hour
	leafValidity      = 365 * 24 * time.Hour
)

// UploadServiceHost is the DNS name the proxy dials (and verifies) for an
// upload pod: <service>.<namespace>.svc.
func UploadServiceHost(serviceName, namespace string) string {
	return serviceName + "." + namespace + ".svc"
}

// EnsureCA returns the CA kept in Secret name of the install namespace,
// creating it when absent. Concurrent creators converge on the first one.
func EnsureCA(ctx context.Context, c client.Client, r client.Reader, namespace, name string) (*pki.CA, error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	for range 3 {
		s := &corev1.Secret{}
		err := r.Get(ctx, key, s)
		if err == nil {
			ca, err := pki.LoadCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
			if err != nil {
				return nil, fmt.Errorf("Secret %s/%s: %w", namespace, name, err)
			}
			return ca, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading Secret %s/%s: %w", namespace, name, err)
		}
		ca, err := pki.NewCA(name, caValidity)
		if err != nil {
			return nil, err
		}
		s = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{cdiv1.LabelAppManagedBy: "kubefill"}},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM},
		}
		if err := c.Create(ctx, s); err == nil {
			return ca, nil
		} else if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating Secret %s/%s: %w", namespace, name, err)
		}
	}
	return nil, fmt.Errorf("Secret %s/%s keeps changing", namespace, name)
}

// EnsureUploadPKI makes sure the upload server CA, the proxy's client CA and
// the proxy's client certificate exist, and returns both CAs.
func EnsureUploadPKI(ctx context.Context, c client.Client, r client.Reader, namespace string) (serverCA, clientCA *pki.CA, err error) {
	if namespace == "" {
		return nil, nil, fmt.Errorf("the controller's install namespace is not set (POD_NAMESPACE)")
	}
	if serverCA, err = EnsureCA(ctx, c, r, namespace, UploadServerCASecret); err != nil {
		return nil, nil, err
	}
	if clientCA, err = EnsureCA(ctx, c, r, namespace, UploadProxyClientCASecret); err != nil {
		return nil, nil, err
	}
	s := &corev1.Secret{}
	err = r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: UploadProxyClientSecret}, s)
	if err == nil && bytes.Equal(s.Data["ca.crt"], serverCA.CertPEM) {
		return serverCA, clientCA, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, nil, fmt.Errorf("reading Secret %s/%s: %w", namespace, UploadProxyClientSecret, err)
	}
	crt, key, ierr := clientCA.Issue(UploadProxyClientName, nil, true, leafValidity)
	if ierr != nil {
		return nil, nil, ierr
	}
	data := map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key, "ca.crt": serverCA.CertPEM}
	if apierrors.IsNotFound(err) {
		s = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: UploadProxyClientSecret, Namespace: namespace, Labels: map[string]string{cdiv1.LabelAppManagedBy: "kubefill"}},
			Type:       corev1.SecretTypeTLS, Data: data,
		}
		if err := c.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, nil, fmt.Errorf("creating Secret %s/%s: %w", namespace, UploadProxyClientSecret, err)
		}
		return serverCA, clientCA, nil
	}
	s.Data = data
	if err := c.Update(ctx, s); err != nil {
		return nil, nil, fmt.Errorf("updating Secret %s/%s: %w", namespace, UploadProxyClientSecret, err)
	}
	return serverCA, clientCA, nil
}

// ensureServing creates the upload pod's serving Secret and its Service.
func (p *UploadServing) ensureServing(ctx context.Context, target, prime *corev1.PersistentVolumeClaim) error {
	k := p
	name := UploadPodName(prime)
	s := &corev1.Secret{}
	err := k.reader().Get(ctx, types.NamespacedName{Namespace: prime.Namespace, Name: name}, s)
	if apierrors.IsNotFound(err) {
		serverCA, clientCA, err := EnsureUploadPKI(ctx, k.Client, k.reader(), k.Namespace)
		if err != nil {
			return err
		}
		host := UploadServiceHost(name, prime.Namespace)
		crt, key, err := serverCA.Issue(host, []string{name, name + "." + prime.Namespace, host, host + ".cluster.local"}, false, leafValidity)
		if err != nil {
			return err
		}
		s = &corev1.Secret{
			ObjectMeta: servingMeta(name, target, prime),
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key, "client-ca.crt": clientCA.CertPEM},
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
			Selector: map[string]string{LabelUploadTarget: prime.Name},
			Ports: []corev1.ServicePort{{Name: "uploadserver", Protocol: corev1.ProtocolTCP, Port: contract.UploadServicePort,
				TargetPort: intstr.FromInt32(contract.UploadServerPort)}},
		},
	}
	if err := k.Client.Create(ctx, svc); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating upload Service %s: %w", name, err)
	}
	return nil
}

// servingMeta is the metadata of an object serving target's upload pod.
func servingMeta(name string, target, prime *corev1.PersistentVolumeClaim) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: prime.Namespace, Labels: workerLabels(target, "upload-server"), OwnerReferences: ownedBy(target, prime.Namespace)}
}
