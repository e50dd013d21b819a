package certs

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/pki"
)

// Store reads and writes the chains' Secrets and ConfigMaps in Namespace.
// Reads go through Reader, uncached (the controller does not watch Secrets).
type Store struct {
	Client    client.Client
	Reader    client.Reader
	Namespace string
}

func (s *Store) reader() client.Reader {
	if s.Reader != nil {
		return s.Reader
	}
	return s.Client
}

// Signer is a signer's CA with its certificate parsed.
type Signer struct {
	CA   *pki.CA
	Cert *x509.Certificate
}

func loadSigner(sec *corev1.Secret) (*Signer, error) {
	ca, err := pki.LoadCA(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, err
	}
	cert, err := parseCert(ca.CertPEM)
	if err != nil {
		return nil, err
	}
	return &Signer{CA: ca, Cert: cert}, nil
}

func parseCert(pemBytes []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(pemBytes)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("no PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

// parseBundle reads every certificate of a PEM bundle, skipping what does
// not parse.
func parseBundle(pemBytes []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, pemBytes = pem.Decode(pemBytes)
		if b == nil {
			return out
		}
		if c, err := x509.ParseCertificate(b.Bytes); err == nil && b.Type == "CERTIFICATE" {
			out = append(out, c)
		}
	}
}

func encodeBundle(certs []*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return buf.Bytes()
}

func (s *Store) getSecret(ctx context.Context, name string) (*corev1.Secret, error) {
	sec := &corev1.Secret{}
	err := s.reader().Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: name}, sec)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading Secret %s/%s: %w", s.Namespace, name, err)
	}
	return sec, nil
}

// haveSigner is what a signer Secret holds, for Decide.
func haveSigner(sec *corev1.Secret) (Have, *Signer) {
	if sec == nil {
		return Have{}, nil
	}
	sg, err := loadSigner(sec)
	if err != nil {
		return Have{Config: sec.Annotations[cdiv1.AnnCertConfig]}, nil
	}
	return Have{Cert: sg.Cert, Config: sec.Annotations[cdiv1.AnnCertConfig]}, sg
}

// haveLeaf is what a leaf Secret holds, for Decide: its certificate when
// it and the key form a pair.
func haveLeaf(sec *corev1.Secret) Have {
	if sec == nil {
		return Have{}
	}
	return Have{Config: sec.Annotations[cdiv1.AnnCertConfig], Cert: haveLeafData(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])}
}

// haveLeafData is the certificate of certPEM when it and keyPEM form a
// pair, else nil.
func haveLeafData(certPEM, keyPEM []byte) *x509.Certificate {
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		return nil
	}
	c, _ := parseCert(certPEM)
	return c
}

// certAnnotations are the annotations library-go keeps on a certificate Secret.
func certAnnotations(cert *x509.Certificate, cfg Lifetime, hosts []string) map[string]string {
	a := map[string]string{
		cdiv1.AnnCertConfig:    cfg.Annotation(),
		cdiv1.AnnCertNotAfter:  cert.NotAfter.UTC().Format(time.RFC3339),
		cdiv1.AnnCertNotBefore: cert.NotBefore.UTC().Format(time.RFC3339),
		cdiv1.AnnCertIssuer:    cert.Issuer.CommonName,
	}
	if hosts != nil {
		a[cdiv1.AnnCertHostnames] = joinHosts(hosts)
	}
	return a
}

// writeSecret creates the TLS Secret name, or updates existing (read just
// before, so a concurrent writer makes this fail with a conflict).
func (s *Store) writeSecret(ctx context.Context, existing *corev1.Secret, name string, data map[string][]byte, ann map[string]string) error {
	if existing == nil {
		sec := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.Namespace, Labels: managedLabels(), Annotations: ann},
			Type:       corev1.SecretTypeTLS,
			Data:       data,
		}
		if err := s.Client.Create(ctx, sec); err != nil {
			return fmt.Errorf("creating Secret %s/%s: %w", s.Namespace, name, err)
		}
		return nil
	}
	if existing.Type != corev1.SecretTypeTLS {
		return fmt.Errorf("Secret %s/%s has type %q, not %q: delete it and the controller makes it again", s.Namespace, name, existing.Type, corev1.SecretTypeTLS)
	}
	sec := existing.DeepCopy()
	if sec.Annotations == nil {
		sec.Annotations = map[string]string{}
	}
	maps.Copy(sec.Annotations, ann)
	if sec.Labels == nil {
		sec.Labels = map[string]string{}
	}
	maps.Copy(sec.Labels, managedLabels())
	sec.Data = data
	if err := s.Client.Update(ctx, sec); err != nil {
		return fmt.Errorf("updating Secret %s/%s: %w", s.Namespace, name, err)
	}
	return nil
}

func managedLabels() map[string]string {
	return map[string]string{cdiv1.LabelAppManagedBy: "kubefill"}
}

// caCommonName names a signer's CA as library-go does: <ns>_<name>@<unix time>.
func (s *Store) caCommonName(name string, now time.Time) string {
	return fmt.Sprintf("%s_%s@%d", s.Namespace, name, now.Unix())
}

// EnsureSigner returns the CA in signer Secret name, rotating it per cfg
// when rotate is set (the controller) and otherwise only creating it when
// absent or broken (the populators, which may run before the controller's
// first pass). It returns what it decided.
func (s *Store) EnsureSigner(ctx context.Context, name string, cfg Lifetime, now time.Time, rotate bool) (*Signer, Decision, error) {
	sec, err := s.getSecret(ctx, name)
	if err != nil {
		return nil, Decision{}, err
	}
	have, sg := haveSigner(sec)
	d := Decide(now, have, Want{Config: cfg})
	if sg != nil && (!d.Renew || !rotate) {
		if !d.Renew {
			return sg, d, nil
		}
		return sg, Decision{RefreshAt: now}, nil
	}
	if sg == nil {
		d = Decision{Renew: true, Reason: "missing"}
		if sec != nil {
			d.Reason = "its CA certificate or key does not load"
		}
	}
	ca, err := pki.NewCA(s.caCommonName(name, now), cfg.Lifetime.Duration)
	if err != nil {
		return nil, d, fmt.Errorf("signer %s: %w", name, err)
	}
	cert, err := parseCert(ca.CertPEM)
	if err != nil {
		return nil, d, err
	}
	data := map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM}
	if err := s.writeSecret(ctx, sec, name, data, certAnnotations(cert, cfg, nil)); err != nil {
		return nil, d, err
	}
	return &Signer{CA: ca, Cert: cert}, d, nil
}

// EnsureBundle makes signer's bundle ConfigMap hold current first and every
// other CA in it that is still valid. It returns the bundle and when its
// next CA expires (the bundle then sheds it).
func (s *Store) EnsureBundle(ctx context.Context, signer string, current *x509.Certificate, now time.Time) ([]byte, time.Time, error) {
	name := BundleName(signer)
	cm := &corev1.ConfigMap{}
	err := s.reader().Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: name}, cm)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, time.Time{}, fmt.Errorf("reading ConfigMap %s/%s: %w", s.Namespace, name, err)
	}
	exists := err == nil
	keep := KeepInBundle(now, current, parseBundle([]byte(cm.Data[BundleKey])))
	var expiry time.Time
	for _, c := range keep[1:] {
		if expiry.IsZero() || c.NotAfter.Before(expiry) {
			expiry = c.NotAfter
		}
	}
	bundle := encodeBundle(keep)
	if exists && cm.Data[BundleKey] == string(bundle) {
		return bundle, expiry, nil
	}
	if !exists {
		cm = &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.Namespace, Labels: managedLabels()},
			Data:       map[string]string{BundleKey: string(bundle)},
		}
		if err := s.Client.Create(ctx, cm); err != nil {
			return nil, time.Time{}, fmt.Errorf("creating ConfigMap %s/%s: %w", s.Namespace, name, err)
		}
		return bundle, expiry, nil
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[BundleKey] = string(bundle)
	if err := s.Client.Update(ctx, cm); err != nil {
		return nil, time.Time{}, fmt.Errorf("updating ConfigMap %s/%s: %w", s.Namespace, name, err)
	}
	return bundle, expiry, nil
}

// ReadBundle returns signer's bundle ConfigMap's PEM; nil when absent.
func (s *Store) ReadBundle(ctx context.Context, signer string) ([]byte, error) {
	cm := &corev1.ConfigMap{}
	err := s.reader().Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: BundleName(signer)}, cm)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading ConfigMap %s/%s: %w", s.Namespace, BundleName(signer), err)
	}
	return []byte(cm.Data[BundleKey]), nil
}

// EnsureLeaf keeps leaf Secret l issued by signer per cfg (and for hosts,
// for a serving certificate); extra keys (such as ClientCertCAKey) are kept
// equal to the given values. With rotate unset it only creates a missing or
// broken certificate. It returns what it decided about the certificate.
func (s *Store) EnsureLeaf(ctx context.Context, l leaf, signer *Signer, cfg Lifetime, hosts []string, extra map[string][]byte, now time.Time, rotate bool) (Decision, error) {
	sec, err := s.getSecret(ctx, l.secret)
	if err != nil {
		return Decision{}, err
	}
	want := Want{Config: cfg, Signer: signer.Cert}
	if !l.client {
		want.Hosts = hosts
	}
	have := haveLeaf(sec)
	d := Decide(now, have, want)
	if have.Cert != nil && d.Renew && !rotate {
		d = Decision{RefreshAt: now}
	}
	if !d.Renew {
		stale := false
		for k, v := range extra {
			if !bytes.Equal(sec.Data[k], v) {
				stale = true
			}
		}
		if !stale {
			return d, nil
		}
		data := maps.Clone(sec.Data)
		maps.Copy(data, extra)
		return d, s.writeSecret(ctx, sec, l.secret, data, nil)
	}
	usage := x509.ExtKeyUsageServerAuth
	if l.client {
		usage = x509.ExtKeyUsageClientAuth
	}
	crt, key, err := signer.CA.IssueWith(pki.LeafOptions{CommonName: l.commonName, Hosts: want.Hosts, Usages: []x509.ExtKeyUsage{usage}, Validity: cfg.Lifetime.Duration})
	if err != nil {
		return d, fmt.Errorf("issuing %s: %w", l.secret, err)
	}
	cert, err := parseCert(crt)
	if err != nil {
		return d, err
	}
	data := map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key}
	maps.Copy(data, extra)
	return d, s.writeSecret(ctx, sec, l.secret, data, certAnnotations(cert, cfg, want.Hosts))
}
