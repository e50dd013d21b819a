package certs

import (
	"crypto/x509"
	"slices"
	"time"
)

// Have is what a Secret holds now.
type Have struct {
	// Cert is the Secret's certificate; nil when the Secret is absent, or
	// its certificate and key are missing, unparseable or not a pair.
	Cert *x509.Certificate
	// Config is the Secret's cdiv1.AnnCertConfig annotation.
	Config string
}

// Want is what the Secret should hold.
type Want struct {
	Config Lifetime
	// Signer is the CA a leaf must be signed by; nil for a signer itself.
	Signer *x509.Certificate
	// Hosts are a serving certificate's names and addresses; nil for a CA
	// or a client certificate.
	Hosts []string
}

// Decision says whether to issue a new certificate, why, and otherwise when
// to look again.
type Decision struct {
	Renew  bool
	Reason string
	// RefreshAt is when the current certificate is due; zero when Renew.
	RefreshAt time.Time
}

// Decide is the rotation rule of one Secret, as library-go's certrotation
// applies it: a certificate is issued again when it is missing or broken,
// when its recorded config differs from the wanted one, when it is past its
// refresh time (NotAfter minus the renew-before period, that is refresh
// after it was issued) or expired, when a leaf was not signed by the
// current signer (the signer rotated), and when a serving certificate's
// names differ from the wanted ones.
func Decide(now time.Time, have Have, want Want) Decision {
	renew := func(reason string) Decision { return Decision{Renew: true, Reason: reason} }
	c := have.Cert
	if c == nil {
		return renew("missing")
	}
	if have.Config != want.Config.Annotation() {
		return renew("its certificate config changed to " + want.Config.Annotation())
	}
	if !now.Before(c.NotAfter) {
		return renew("expired at " + c.NotAfter.UTC().Format(time.RFC3339))
	}
	refreshAt := c.NotAfter.Add(-want.Config.RenewBefore())
	if !now.Before(refreshAt) {
		return renew("due for refresh since " + refreshAt.UTC().Format(time.RFC3339))
	}
	if want.Signer != nil && c.CheckSignatureFrom(want.Signer) != nil {
		return renew("not signed by the current signer " + want.Signer.Subject.CommonName)
	}
	if want.Hosts != nil && !slices.Equal(certHosts(c), sortedHosts(want.Hosts)) {
		return renew("its hostnames differ from " + joinHosts(want.Hosts))
	}
	return Decision{RefreshAt: refreshAt}
}

// KeepInBundle says which CA certificates a bundle keeps: the current
// signer first, then every other one still valid at now, each once, in
// their order.
func KeepInBundle(now time.Time, current *x509.Certificate, bundle []*x509.Certificate) []*x509.Certificate {
	out := []*x509.Certificate{current}
	for _, c := range bundle {
		if !now.Before(c.NotAfter) || slices.ContainsFunc(out, func(o *x509.Certificate) bool { return o.Equal(c) }) {
			continue
		}
		out = append(out, c)
	}
	return out
}
