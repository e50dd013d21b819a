package v1beta1

// Annotations on the certificate Secrets and CA bundle ConfigMaps the
// controller keeps in the install namespace, as CDI's operator (through
// openshift library-go certrotation) writes them.
const (
	// AnnCertConfig is the effective lifetime and refresh of a Secret's
	// certificate, JSON {"lifetime":"48h0m0s","refresh":"24h0m0s"}. When it
	// changes the certificate is issued again.
	AnnCertConfig = "operator.cdi.kubevirt.io/certConfig"
	// AnnCertNotAfter and AnnCertNotBefore are the certificate's validity, RFC 3339.
	AnnCertNotAfter  = "auth.openshift.io/certificate-not-after"
	AnnCertNotBefore = "auth.openshift.io/certificate-not-before"
	// AnnCertIssuer is the common name of the certificate's issuer.
	AnnCertIssuer = "auth.openshift.io/certificate-issuer"
	// AnnCertHostnames are a serving certificate's names, comma-separated.
	AnnCertHostnames = "auth.openshift.io/certificate-hostnames"
)
