package populators

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Cross-namespace sources: a claim whose dataSourceRef names a source in
// another namespace (the CrossNamespaceVolumeDataSource gate) is filled only
// when a Gateway API ReferenceGrant in the source's namespace allows it, as
// kubernetes-csi/lib-volume-populator decides it. The Gateway API module is
// not a dependency: grants are read as unstructured objects.

// ReferenceGrantGroup is the API group of ReferenceGrants.
const ReferenceGrantGroup = "gateway.networking.k8s.io"

// ReferenceGrantVersions are the versions grants are listed in, in order:
// v1beta1 is served by every Gateway API release that has ReferenceGrant in
// its standard channel, v1 by newer ones. Both hold the same objects.
var ReferenceGrantVersions = []string{"v1beta1", "v1"}

const referenceGrantKind = "ReferenceGrant"

// referenceGrant is the part of a gateway.networking.k8s.io ReferenceGrant
// the decision reads.
type referenceGrant struct {
	Namespace string
	Spec      struct {
		From []struct {
			Group     string `json:"group"`
			Kind      string `json:"kind"`
			Namespace string `json:"namespace"`
		} `json:"from"`
		To []struct {
			Group string  `json:"group"`
			Kind  string  `json:"kind"`
			Name  *string `json:"name"`
		} `json:"to"`
	}
}

// parseReferenceGrant reads u as a ReferenceGrant of a version the decision
// knows; ok is false for anything else, which then allows nothing.
func parseReferenceGrant(u *unstructured.Unstructured) (referenceGrant, bool) {
	var g referenceGrant
	gvk := u.GroupVersionKind()
	if gvk.Group != ReferenceGrantGroup || gvk.Kind != referenceGrantKind || !knownGrantVersion(gvk.Version) {
		return g, false
	}
	spec, ok := u.Object["spec"].(map[string]any)
	if !ok {
		return g, false
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(spec, &g.Spec); err != nil {
		return g, false
	}
	g.Namespace = u.GetNamespace()
	return g, true
}

func knownGrantVersion(v string) bool {
	for _, known := range ReferenceGrantVersions {
		if v == known {
			return true
		}
	}
	return false
}

// IsCrossNamespace reports whether target's source (see SourceNamespace)
// lives in another namespace than the claim's.
func IsCrossNamespace(target *corev1.PersistentVolumeClaim) bool {
	return target.Spec.DataSourceRef != nil && SourceNamespace(target) != target.Namespace
}

// GrantAllows reports whether one of grants lets target use the source its
// dataSourceRef names. A claim whose source is in its own namespace needs no
// grant. Otherwise a grant counts when it sits in the source's namespace,
// allows from {group "", kind PersistentVolumeClaim, namespace = the claim's}
// and to {group and kind of the dataSourceRef, name empty or the source's}.
func GrantAllows(target *corev1.PersistentVolumeClaim, grants []unstructured.Unstructured) bool {
	if !IsCrossNamespace(target) {
		return true
	}
	ref := target.Spec.DataSourceRef
	group := ptr.Deref(ref.APIGroup, "")
	for i := range grants {
		g, ok := parseReferenceGrant(&grants[i])
		if !ok || g.Namespace != SourceNamespace(target) {
			continue
		}
		from := false
		for _, f := range g.Spec.From {
			if f.Group == "" && f.Kind == "PersistentVolumeClaim" && f.Namespace == target.Namespace {
				from = true
				break
			}
		}
		if !from {
			continue
		}
		for _, to := range g.Spec.To {
			if to.Group == group && to.Kind == ref.Kind && (ptr.Deref(to.Name, "") == "" || *to.Name == ref.Name) {
				return true
			}
		}
	}
	return false
}

// refusedPrefix says which claim may not use which source.
func refusedPrefix(target *corev1.PersistentVolumeClaim) string {
	ref := target.Spec.DataSourceRef
	return fmt.Sprintf("PersistentVolumeClaim %s/%s may not use %s %s/%s", target.Namespace, target.Name, ref.Kind, SourceNamespace(target), ref.Name)
}

// grantToCreate describes the ReferenceGrant that would allow target.
func grantToCreate(target *corev1.PersistentVolumeClaim) string {
	ref := target.Spec.DataSourceRef
	return fmt.Sprintf(`a ReferenceGrant (%s/%s) in namespace %s with spec.from [{group: "", kind: PersistentVolumeClaim, namespace: %s}] and spec.to [{group: %q, kind: %s, name: %s}]`,
		ReferenceGrantGroup, ReferenceGrantVersions[0], SourceNamespace(target), target.Namespace, ptr.Deref(ref.APIGroup, ""), ref.Kind, ref.Name)
}

// GrantRefusal is the message for a cross-namespace target no grant allows.
func GrantRefusal(target *corev1.PersistentVolumeClaim) string {
	return fmt.Sprintf("%s: no ReferenceGrant in namespace %s allows PersistentVolumeClaims from namespace %s to use it; create %s",
		refusedPrefix(target), SourceNamespace(target), target.Namespace, grantToCreate(target))
}

// GrantCRDMissing is the message for a cross-namespace target on a cluster
// that serves no ReferenceGrants.
func GrantCRDMissing(target *corev1.PersistentVolumeClaim) string {
	return fmt.Sprintf("%s: the ReferenceGrant CRD (referencegrants.%s) is not installed, so cross-namespace sources are refused; install the Gateway API's ReferenceGrant CRD and create %s",
		refusedPrefix(target), ReferenceGrantGroup, grantToCreate(target))
}

// GrantChecker decides whether a claim may use a source in another
// namespace, from the ReferenceGrants there.
type GrantChecker struct {
	// Reader lists ReferenceGrants; uncached (the manager's API reader), so
	// that no informer on a CRD that may be missing is needed.
	Reader client.Reader
}

// Allowed reports whether target may use the source its dataSourceRef names.
// A source in the claim's own namespace (or a ref without a namespace) is
// always allowed, and nothing is read. Otherwise the ReferenceGrants of the
// source's namespace decide; when they do not allow it, message says why
// and what to create, for an event and the claim's running condition. A
// cluster without the ReferenceGrant CRD allows no cross-namespace source.
// err is a failure to read the grants (retry).
func (g *GrantChecker) Allowed(ctx context.Context, target *corev1.PersistentVolumeClaim) (allowed bool, message string, err error) {
	if !IsCrossNamespace(target) {
		return true, "", nil
	}
	if g == nil || g.Reader == nil {
		return false, "", errors.New("no ReferenceGrant reader: cross-namespace sources cannot be checked")
	}
	ns := SourceNamespace(target)
	for _, version := range ReferenceGrantVersions {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(schema.GroupVersionKind{Group: ReferenceGrantGroup, Version: version, Kind: referenceGrantKind + "List"})
		err := g.Reader.List(ctx, list, client.InNamespace(ns))
		if meta.IsNoMatchError(err) || apierrors.IsNotFound(err) {
			continue // this version is not served; try the next
		}
		if err != nil {
			return false, "", fmt.Errorf("listing ReferenceGrants (%s/%s) in namespace %s: %w", ReferenceGrantGroup, version, ns, err)
		}
		if GrantAllows(target, list.Items) {
			return true, "", nil
		}
		return false, GrantRefusal(target), nil
	}
	return false, GrantCRDMissing(target), nil
}
