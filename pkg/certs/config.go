// Package certs keeps CDI's four certificate chains in the install
// namespace, as CDI's operator does with library-go certrotation: a signer
// Secret (a CA) and a CA bundle ConfigMap per chain, the serving and client
// certificates the signers issue, rotation on CDI's schedule (configurable
// through the CDI CR's spec.certConfig), and the API server's bundle
// injected into the APIService and the webhook configurations that point at
// its Service. A fifth chain is Kubefill's own: the clone client signer,
// whose short-lived leaves the clone populator issues (IssueCloneClient).
package certs

import (
	"encoding/json"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// Lifetime is how long a certificate is valid and how long after it is
// issued it is replaced (refresh < lifetime). It is recorded on each Secret
// as JSON in cdiv1.AnnCertConfig, with CDI's field names.
type Lifetime struct {
	Lifetime metav1.Duration `json:"lifetime"`
	Refresh  metav1.Duration `json:"refresh"`
}

// RenewBefore is how long before its expiry a certificate is replaced.
func (l Lifetime) RenewBefore() time.Duration { return l.Lifetime.Duration - l.Refresh.Duration }

// Annotation is l as cdiv1.AnnCertConfig records it.
func (l Lifetime) Annotation() string {
	b, _ := json.Marshal(l)
	return string(b)
}

func lifetime(life, refresh time.Duration) Lifetime {
	return Lifetime{Lifetime: metav1.Duration{Duration: life}, Refresh: metav1.Duration{Duration: refresh}}
}

// Settings are the lifetimes of the three kinds of certificate.
type Settings struct {
	// CA is every signer's.
	CA Lifetime
	// Server is the serving certificates' (the API server, the upload
	// proxy, each upload server).
	Server Lifetime
	// Client is the upload-server client certificate's.
	Client Lifetime
}

// DefaultSettings are CDI's: CAs 48h renewed after 24h, leaves 24h renewed
// after 12h.
func DefaultSettings() Settings {
	return Settings{
		CA:     lifetime(48*time.Hour, 24*time.Hour),
		Server: lifetime(24*time.Hour, 12*time.Hour),
		Client: lifetime(24*time.Hour, 12*time.Hour),
	}
}

// SettingsFrom applies a CDI CR's spec.certConfig to CDI's defaults. A
// duration alone keeps the default's proportion (renewed halfway); a
// renewBefore alone applies to the default duration. A part that makes no
// sense (a duration that is not positive, a renewBefore not shorter than
// the duration) keeps the default, and is named in the returned problems.
func SettingsFrom(cc *cdiv1.CDICertConfig) (Settings, []string) {
	s := DefaultSettings()
	if cc == nil {
		return s, nil
	}
	var problems []string
	apply := func(what string, dst *Lifetime, c *cdiv1.CertConfig) {
		if c == nil || (c.Duration == nil && c.RenewBefore == nil) {
			return
		}
		def := *dst
		life := def.Lifetime.Duration
		if c.Duration != nil {
			life = c.Duration.Duration
		}
		renewBefore := time.Duration(float64(life) * float64(def.RenewBefore()) / float64(def.Lifetime.Duration))
		if c.RenewBefore != nil {
			renewBefore = c.RenewBefore.Duration
		}
		switch {
		case life <= 0:
			problems = append(problems, fmt.Sprintf("spec.certConfig.%s.duration %s is not positive; using %s", what, life, def.Lifetime.Duration))
		case renewBefore <= 0 || renewBefore >= life:
			problems = append(problems, fmt.Sprintf("spec.certConfig.%s.renewBefore %s must be positive and shorter than the duration %s; using duration %s, renewBefore %s",
				what, renewBefore, life, def.Lifetime.Duration, def.RenewBefore()))
		default:
			*dst = lifetime(life, life-renewBefore)
		}
	}
	apply("ca", &s.CA, cc.CA)
	apply("server", &s.Server, cc.Server)
	apply("client", &s.Client, cc.Client)
	return s, problems
}
