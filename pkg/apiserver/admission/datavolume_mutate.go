package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

	"github.com/kubefill/kubefill/pkg/cloneauth"
	"github.com/kubefill/kubefill/pkg/token"
)

// DataSourceGetter reads a DataSource.
type DataSourceGetter func(ctx context.Context, namespace, name string) (*cdiv1.DataSource, error)

// ResolveCloneSource returns the clone source of dv, or nil if dv does not
// clone. A sourceRef is followed to its DataSource, and from there at most one
// more DataSource, as CDI allows.
func ResolveCloneSource(ctx context.Context, dv *cdiv1.DataVolume, get DataSourceGetter) (*cloneauth.Source, error) {
	fromPair := func(pvc *cdiv1.DataVolumeSourcePVC, snap *cdiv1.DataVolumeSourceSnapshot, defNS string) *cloneauth.Source {
		switch {
		case pvc != nil:
			return &cloneauth.Source{Resource: token.ResourcePVC, Namespace: orDefault(pvc.Namespace, defNS), Name: pvc.Name}
		case snap != nil:
			return &cloneauth.Source{Resource: token.ResourceVolumeSnapshot, Namespace: orDefault(snap.Namespace, defNS), Name: snap.Name}
		}
		return nil
	}
	if dv.Spec.Source != nil {
		return fromPair(dv.Spec.Source.PVC, dv.Spec.Source.Snapshot, dv.Namespace), nil
	}
	ref := dv.Spec.SourceRef
	if ref == nil || ref.Kind != cdiv1.DataVolumeDataSource {
		return nil, nil
	}
	ns := dv.Namespace
	if ref.Namespace != nil && *ref.Namespace != "" {
		ns = *ref.Namespace
	}
	ds, err := get(ctx, ns, ref.Name)
	if err != nil {
		return nil, fmt.Errorf("reading DataSource %s/%s named by spec.sourceRef: %w", ns, ref.Name, err)
	}
	if next := ds.Spec.Source.DataSource; next != nil {
		nns := orDefault(next.Namespace, ds.Namespace)
		ds, err = get(ctx, nns, next.Name)
		if err != nil {
			return nil, fmt.Errorf("reading DataSource %s/%s that DataSource %s/%s points to: %w", nns, next.Name, ns, ref.Name, err)
		}
		if ds.Spec.Source.DataSource != nil {
			return nil, fmt.Errorf("DataSource %s/%s points to another DataSource more than one level deep", ns, ref.Name)
		}
	}
	return fromPair(ds.Spec.Source.PVC, ds.Spec.Source.Snapshot, ds.Namespace), nil
}

// unresolvedDataSource is the source to authorise when dv clones through a
// sourceRef whose DataSource does not exist yet or names no source yet
// (resolveErr is NotFound, or there was no error and no source): a golden
// image before its first import. The user is then authorised for the
// DataSource's namespace, and the controller accepts the token once the
// DataSource resolves to a source in that namespace.
func unresolvedDataSource(dv *cdiv1.DataVolume, resolveErr error) (cloneauth.Source, bool) {
	ref := dv.Spec.SourceRef
	if dv.Spec.Source != nil || ref == nil || ref.Kind != cdiv1.DataVolumeDataSource || ref.Name == "" {
		return cloneauth.Source{}, false
	}
	if resolveErr != nil && !apierrors.IsNotFound(resolveErr) {
		return cloneauth.Source{}, false
	}
	return cloneauth.Source{Resource: token.ResourceDataSource, Namespace: orDefault(derefString(ref.Namespace), dv.Namespace), Name: ref.Name}, true
}

func derefString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// DataVolumeMutator is the mutating webhook that authorises clones and adds
// the clone token annotation.
type DataVolumeMutator struct {
	Client client.Client
	Tokens token.Generator
	// ControllerUser is the controller's username: its clone DataVolumes
	// are authorised for their DataImportCron's ServiceAccount
	// (authorizeClone). Empty: no request is treated as the controller's.
	ControllerUser string
}

// cloneTokenKeys are the annotations that carry clone authority: only this
// webhook (the short token, at creation) and the controller (the extended
// token) set them, so whatever a request brings is removed.
var cloneTokenKeys = []string{cdiv1.AnnCloneToken, cdiv1.AnnExtendedCloneToken}

// Admit implements AdmitFunc.
func (m *DataVolumeMutator) Admit(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Kind.Group != cdiv1.GroupName || req.Kind.Kind != "DataVolume" {
		return badRequest(fmt.Sprintf("this webhook mutates DataVolumes, not %s", req.Kind.String()))
	}
	// The token is issued once, when the DataVolume is created; the
	// validating webhook keeps it from changing afterwards.
	if req.Operation != admissionv1.Create {
		return allowed()
	}
	var dv cdiv1.DataVolume
	if err := json.Unmarshal(req.Object.Raw, &dv); err != nil {
		return badRequest("cannot decode the DataVolume: " + err.Error())
	}
	if dv.Namespace == "" {
		dv.Namespace = req.Namespace
	}
	// A clone token the request brings (one answered to a forged review,
	// or copied from another DataVolume) is never admitted: it is removed
	// before anything is decided, and a clone gets a token of its own.
	stripped := strippedTokens(dv.Annotations)
	if dv.DeletionTimestamp != nil {
		return annotationResponse(dv.Annotations, nil, stripped)
	}
	targetName := dv.Name
	if targetName == "" {
		targetName = req.Name
	}
	if targetName == "" {
		// generateName: the name is not known yet, and a token must name its target.
		if dv.Spec.Source != nil && (dv.Spec.Source.PVC != nil || dv.Spec.Source.Snapshot != nil) || dv.Spec.SourceRef != nil {
			return badRequest("a cloning DataVolume needs metadata.name; generateName is not supported because the clone token names its target")
		}
		return annotationResponse(dv.Annotations, nil, stripped)
	}
	src, err := ResolveCloneSource(ctx, &dv, func(ctx context.Context, ns, name string) (*cdiv1.DataSource, error) {
		var ds cdiv1.DataSource
		if err := m.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &ds); err != nil {
			return nil, err
		}
		return &ds, nil
	})
	if err != nil || src == nil {
		if ds, ok := unresolvedDataSource(&dv, err); ok {
			src, err = &ds, nil
		}
	}
	// As in CDI, a pre-populated DataVolume (a restore) clones nothing: its
	// controller creates no claim and only adopts one of its own namespace.
	// It gets a token if its user may clone the source, and is let in
	// without one if the source is gone or the user may not.
	prePopulated := cdiv1.DataVolumePrePopulated(&dv)
	if err != nil && prePopulated && apierrors.IsNotFound(err) {
		return annotationResponse(dv.Annotations, nil, stripped)
	}
	if err != nil {
		return badRequest(err.Error())
	}
	if src == nil {
		// A token on a non-clone is meaningless; drop it rather than keep a stray credential.
		return annotationResponse(dv.Annotations, nil, stripped)
	}
	if src.Name == "" {
		return badRequest("the clone source names no object")
	}
	// Unlike CDI, which skips the check within one namespace, the review runs
	// for same-namespace clones too: creating a DataVolume must not become a
	// way to read a claim one could not otherwise mount. requester is who
	// the clone was authorised for (the user, or a DataImportCron's
	// ServiceAccount for the controller's imports), and whom the token
	// records, so that the controller can authorise the same identity again
	// if the source a sourceRef resolves to changes.
	requester, ok, reason, err := m.authorizeClone(ctx, req, &dv, *src)
	if err != nil {
		return internalError(err)
	}
	if !ok && prePopulated {
		return annotationResponse(dv.Annotations, nil, stripped)
	}
	if !ok {
		return forbidden(reason)
	}
	payload := token.WithRequester(token.NewClonePayload(src.Resource, src.Namespace, src.Name, dv.Namespace, targetName), token.RequesterOf(requester))
	tok, err := m.Tokens.Generate(payload)
	if err != nil {
		return internalError(fmt.Errorf("generating clone token: %w", err))
	}
	return annotationResponse(dv.Annotations, map[string]string{cdiv1.AnnCloneToken: tok}, stripped)
}

// strippedTokens are the clone token annotations present in ann, in
// cloneTokenKeys' order. Pure.
func strippedTokens(ann map[string]string) []string {
	var out []string
	for _, k := range cloneTokenKeys {
		if _, ok := ann[k]; ok {
			out = append(out, k)
		}
	}
	return out
}

// annotationResponse allows the object with set added to (or replacing in)
// its annotations current and the keys remove removed; with nothing to
// change it allows it unpatched.
func annotationResponse(current, set map[string]string, remove []string) *admissionv1.AdmissionResponse {
	ops := annotationPatch(current, set, remove)
	if len(ops) == 0 {
		return allowed()
	}
	return patchResponse(ops)
}

// annotationPatch is the JSON patch that sets set and removes remove
// (keys of current; a key also in set is replaced, not removed). Pure.
func annotationPatch(current, set map[string]string, remove []string) []patchOp {
	var ops []patchOp
	for _, k := range remove {
		if _, replaced := set[k]; !replaced {
			ops = append(ops, removeAnnotationPatch(k)...)
		}
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if current == nil && len(set) > 0 {
		return append(ops, patchOp{Op: "add", Path: "/metadata/annotations", Value: set})
	}
	for _, k := range keys {
		ops = append(ops, setAnnotationPatch(current, k, set[k])...)
	}
	return ops
}

type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func setAnnotationPatch(current map[string]string, key, value string) []patchOp {
	if current == nil {
		return []patchOp{{Op: "add", Path: "/metadata/annotations", Value: map[string]string{key: value}}}
	}
	return []patchOp{{Op: "add", Path: "/metadata/annotations/" + escapePointer(key), Value: value}}
}

func removeAnnotationPatch(key string) []patchOp {
	return []patchOp{{Op: "remove", Path: "/metadata/annotations/" + escapePointer(key)}}
}

func patchResponse(ops []patchOp) *admissionv1.AdmissionResponse {
	data, err := json.Marshal(ops)
	if err != nil {
		return internalError(err)
	}
	pt := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{Allowed: true, Patch: data, PatchType: &pt}
}
