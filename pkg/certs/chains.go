package certs

import (
	"crypto/x509"
	"net"
	"slices"
	"strings"
)

// CDI's Secret and ConfigMap names, in the install namespace.
const (
	APIServerSigner          = "cdi-apiserver-signer"
	APIServerServerCert      = "cdi-apiserver-server-cert"
	UploadProxySigner        = "cdi-uploadproxy-signer"
	UploadProxyServerCert    = "cdi-uploadproxy-server-cert"
	UploadServerSigner       = "cdi-uploadserver-signer"
	UploadServerClientSigner = "cdi-uploadserver-client-signer"
	UploadServerClientCert   = "cdi-uploadserver-client-cert"

	// CloneClientSigner is Kubefill's own chain (CDI has none): the CA of
	// the host-assisted clones' source pods' client certificates. The
	// upload server of a clone trusts it and nothing else; every other
	// upload server trusts only the upload-server client signer (the
	// proxy's). So no clone certificate can pass for the upload proxy, and
	// the proxy's certificate feeds no clone. Its leaves are not kept here:
	// the clone populator issues one per clone (IssueCloneClient) into the
	// source pod's Secret, next to the clone's prime.
	CloneClientSigner = "kubefill-clone-client-signer"

	// BundleKey is the CA bundle ConfigMap's key.
	BundleKey = "ca-bundle.crt"
	// ClientCertCAKey in UploadServerClientCert holds the upload-server
	// signer's bundle: the CAs its holder (the upload proxy) verifies upload
	// servers with, kept equal to that bundle so the proxy needs one mount.
	ClientCertCAKey = "ca.crt"

	// UploadServerClientName is the upload proxy's client certificate's
	// common name, which upload servers require.
	UploadServerClientName = "client.upload-server.cdi.kubevirt.io"
)

// BundleName is the CA bundle ConfigMap of signer.
func BundleName(signer string) string { return signer + "-bundle" }

// ServiceHosts are a serving certificate's names for a Service: <svc>,
// <svc>.<ns> and <svc>.<ns>.svc.
func ServiceHosts(service, namespace string) []string {
	return []string{service, service + "." + namespace, service + "." + namespace + ".svc"}
}

// leaf is one certificate a signer issues into a Secret.
type leaf struct {
	secret     string
	commonName string
	client     bool
	// hosts of a serving certificate (extra ones come from the cluster).
	hosts []string
}

// chain is a signer and the leaves it issues.
type chain struct {
	signer string
	leaves []leaf
}

func certHosts(c *x509.Certificate) []string {
	hosts := slices.Clone(c.DNSNames)
	for _, ip := range c.IPAddresses {
		hosts = append(hosts, ip.String())
	}
	return sortedHosts(hosts)
}

func sortedHosts(hosts []string) []string {
	out := make([]string, 0, len(hosts))
	for _, h := range hosts {
		if h == "" {
			continue
		}
		if ip := net.ParseIP(h); ip != nil {
			h = ip.String()
		}
		out = append(out, h)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func joinHosts(hosts []string) string { return strings.Join(sortedHosts(hosts), ",") }
