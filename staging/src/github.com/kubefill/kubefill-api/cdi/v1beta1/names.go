package v1beta1

import (
	"fmt"
	"hash/fnv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The names of the objects that serve an upload, chosen here once so that
// the controller (which makes them) and the upload proxy (which finds them)
// agree. A claim's name is a DNS-1123 subdomain: up to 253 characters, dots
// allowed. A pod's name may be one too, but a Service's must be a DNS-1035
// label (63 characters, no dots), and the Service's name is what the upload
// pod's serving certificate vouches for: it must never come out of a claim
// name unchecked (a claim "x.other.svc" must not yield a certificate for
// "cdi-upload-x.other.svc", a name of namespace "other").

// uploadPrefix is CDI's prefix of an upload pod's name (common.UploadPodName).
const uploadPrefix = "cdi-upload"

// ResourceName is CDI's naming.GetResourceName: base-suffix, shortened
// with a hash past 253 characters (a DNS-1123 subdomain's length).
func ResourceName(base, suffix string) string {
	return shortenedName(base, suffix, validation.DNS1123SubdomainMaxLength)
}

// UploadPodName is CDI's name of the upload pod that serves claimName (a
// prime, or an in-place upload target): cdi-upload-<claim>, shortened with
// a hash past 253 characters as CDI's naming.GetResourceName does.
func UploadPodName(claimName string) string { return ResourceName(uploadPrefix, claimName) }

// UploadServiceName is the name of the Service (and of the serving
// certificate's Secret) of the upload pod that serves claimName: CDI's
// cdi-upload-<claim> when that is a DNS-1035 label, else a label made from
// it: dots become dashes, it is cut to fit, and a hash of the claim's name
// keeps claims apart ("a.b" and "a-b" get different Services). It is
// always a DNS-1035 label.
func UploadServiceName(claimName string) string {
	name := uploadPrefix + "-" + claimName
	if len(validation.IsDNS1035Label(name)) == 0 {
		return name
	}
	readable := strings.ReplaceAll(name, ".", "-")
	sum := nameHash(claimName)
	keep := validation.DNS1035LabelMaxLength - len(sum) - 1
	if len(readable) > keep {
		readable = readable[:keep]
	}
	return strings.TrimRight(readable, "-") + "-" + sum
}

// UploadServiceHost is the in-cluster DNS name of that Service,
// <service>.<namespace>.svc: the name the upload proxy and a clone's source
// pod verify on the upload pod's serving certificate.
func UploadServiceHost(namespace, claimName string) string {
	return UploadServiceName(claimName) + "." + namespace + ".svc"
}

// shortenedName is base-suffix, and past max characters the shape of CDI's
// naming.GetResourceName (openshift's naming.GetName): the base cut, a hash
// of the base, then the suffix; when the suffix itself is too long, the
// base and a hash of the whole name, cut to max.
func shortenedName(base, suffix string, max int) string {
	name := base + "-" + suffix
	if len(name) <= max {
		return name
	}
	keep := max - len(suffix) - 8 - 2
	if keep < 1 {
		out := base[:min(len(base), max-9)] + "-" + nameHash(name)
		return out[:min(max, len(out))]
	}
	return base[:keep] + "-" + nameHash(base) + "-" + suffix
}

// nameHash is the 8 hex digits of the FNV-1a hash of s.
func nameHash(s string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(s))
	return fmt.Sprintf("%08x", h.Sum32())
}
