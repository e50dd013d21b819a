package certs

import (
	"crypto/x509"
	"slices"
	"time"
)

// A host-assisted clone's source pod proves itself to the clone's upload
// server with a client certificate of the clone client signer whose common
// name is the clone's (clone.UploadClientName). The certificate is only
// presented at the TLS handshake, when the pod starts streaming: it lives
// long enough for a pod to start and dial, much less than a clone of a
// large disk takes to stream, and it is issued again for a new source pod
// once it is near its end. It is deleted with the clone.
const (
	// CloneClientValidity is how long a clone client certificate is valid
	// (cut to the signer's own validity).
	CloneClientValidity = 12 * time.Hour
	// CloneClientRenewBefore: a certificate with less left than this is
	// issued again before a new source pod starts.
	CloneClientRenewBefore = 6 * time.Hour
)

// DecideCloneClient is the rule for a clone source pod's certificate,
// which sits in a Secret in the clone's source namespace: it is issued
// again when it is missing or broken (cert nil: no certificate, or one
// that is not a pair with its key), when its common name is not the
// clone's (wantCN, computed by the controller; a certificate whose name was
// changed, or that was issued for another clone, is never used), when it
// is no client certificate, when no CA of the clone signer's bundle
// (trusted) signed it (such as one from the upload proxy's signer, as
// Kubefill issued them before the clone signer existed), and when less
// than CloneClientRenewBefore of it is left. A rotated signer alone is no
// reason: the old CA stays in the bundle the clone's upload server trusts
// until it expires, and the certificate never outlives its CA. Pure.
func DecideCloneClient(now time.Time, cert *x509.Certificate, wantCN string, trusted []*x509.Certificate) Decision {
	renew := func(reason string) Decision { return Decision{Renew: true, Reason: reason} }
	switch {
	case cert == nil:
		return renew("missing")
	case cert.Subject.CommonName != wantCN:
		return renew("its common name " + cert.Subject.CommonName + " is not the clone's " + wantCN)
	case !slices.Contains(cert.ExtKeyUsage, x509.ExtKeyUsageClientAuth):
		return renew("it is no client certificate")
	case !slices.ContainsFunc(trusted, func(ca *x509.Certificate) bool { return cert.CheckSignatureFrom(ca) == nil }):
		return renew("no CA of the clone client signer's bundle signed it")
	case !now.Before(cert.NotAfter):
		return renew("expired at " + cert.NotAfter.UTC().Format(time.RFC3339))
	}
	refreshAt := cert.NotAfter.Add(-CloneClientRenewBefore)
	if !now.Before(refreshAt) {
		return renew("due for refresh since " + refreshAt.UTC().Format(time.RFC3339))
	}
	return Decision{RefreshAt: refreshAt}
}

// IssueCloneClient issues a clone source pod's client certificate with
// common name cn from the clone signer: client auth only, valid for
// CloneClientValidity but not past the signer's own expiry. It returns the
// certificate and key as PEM.
func IssueCloneClient(signer *Signer, cn string, now time.Time) (certPEM, keyPEM []byte, err error) {
	return signer.CA.Issue(cn, nil, true, LeafValidity(signer, CloneClientValidity, now))
}

// ParseBundle reads every certificate of a PEM bundle, skipping what does
// not parse.
func ParseBundle(pemBytes []byte) []*x509.Certificate { return parseBundle(pemBytes) }

// ParseLeaf returns the certificate of a PEM certificate and key when they
// are a pair, else nil.
func ParseLeaf(certPEM, keyPEM []byte) *x509.Certificate {
	return haveLeafData(certPEM, keyPEM)
}
