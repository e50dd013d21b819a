package populators

import (
	"net/url"
	"slices"
	"sort"

	corev1 "k8s.io/api/core/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// InsecureRegistry says whether CDIConfig lists the registry of a
// docker:// endpoint in spec.insecureRegistries, so that the importer or
// poller reaching it skips TLS verification. As CDI matches: the URL's
// host[:port] equals an entry exactly, and only docker:// URLs count (an
// entry with a scheme, or a host without the port the URL gives, matches
// nothing). Pure.
func InsecureRegistry(endpoint string, config *cdiv1.CDIConfig) bool {
	if config == nil {
		return false
	}
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "docker" || u.Host == "" {
		return false
	}
	return slices.Contains(config.Spec.InsecureRegistries, u.Host)
}

// TrustedCAProxy is the ConfigMap CDIConfig names as the import proxy's CA
// bundle (status.importProxy.trustedCAProxy, in the install namespace), or
// "" when none. Pure.
func TrustedCAProxy(config *cdiv1.CDIConfig) string {
	if config == nil || config.Status.ImportProxy == nil || config.Status.ImportProxy.TrustedCAProxy == nil {
		return ""
	}
	return *config.Status.ImportProxy.TrustedCAProxy
}

// ProxyCABundle is the PEM the importer trusts for the import proxy: every
// key of the trustedCAProxy ConfigMap, in key order, since CDI mounts the
// whole ConfigMap and trusts each file in it (ca.crt is the key CDI writes
// itself). Pure.
func ProxyCABundle(cm *corev1.ConfigMap) []byte {
	keys := make([]string, 0, len(cm.Data)+len(cm.BinaryData))
	for k := range cm.Data {
		keys = append(keys, k)
	}
	for k := range cm.BinaryData {
		if _, dup := cm.Data[k]; !dup {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var out []byte
	for _, k := range keys {
		v, ok := cm.Data[k]
		if !ok {
			v = string(cm.BinaryData[k])
		}
		out = append(out, v...)
		if len(v) > 0 && v[len(v)-1] != '\n' {
			out = append(out, '\n')
		}
	}
	return out
}
