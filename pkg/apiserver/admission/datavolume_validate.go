package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// ValidateDataVolumeSpec checks the rules of a DataVolume spec that OpenAPI
// and CEL in the CRD cannot express, plus the CRD's own one-of rules again as
// cheap defence (the CRD may be installed without them, e.g. an older copy).
func ValidateDataVolumeSpec(spec *cdiv1.DataVolumeSpec, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	switch {
	case spec.Source == nil && spec.SourceRef == nil:
		errs = append(errs, field.Required(path.Child("source"), "exactly one of spec.source or spec.sourceRef must be set"))
	case spec.Source != nil && spec.SourceRef != nil:
		errs = append(errs, field.Invalid(path.Child("sourceRef"), "sourceRef", "exactly one of spec.source or spec.sourceRef must be set"))
	}
	switch {
	case spec.PVC == nil && spec.Storage == nil:
		errs = append(errs, field.Required(path.Child("storage"), "exactly one of spec.pvc or spec.storage must be set"))
	case spec.PVC != nil && spec.Storage != nil:
		errs = append(errs, field.Invalid(path.Child("pvc"), "pvc", "exactly one of spec.pvc or spec.storage must be set"))
	}
	if spec.Source != nil {
		errs = append(errs, validateSource(spec.Source, path.Child("source"))...)
	}
	if spec.SourceRef != nil {
		ref := path.Child("sourceRef")
		if spec.SourceRef.Kind != cdiv1.DataVolumeDataSource {
			errs = append(errs, field.NotSupported(ref.Child("kind"), spec.SourceRef.Kind, []string{cdiv1.DataVolumeDataSource}))
		}
		if spec.SourceRef.Name == "" {
			errs = append(errs, field.Required(ref.Child("name"), "the DataSource to use"))
		}
		if ns := spec.SourceRef.Namespace; ns != nil && *ns != "" {
			for _, m := range validation.IsDNS1123Label(*ns) {
				errs = append(errs, field.Invalid(ref.Child("namespace"), *ns, m))
			}
		}
	}
	cloning := spec.SourceRef != nil || (spec.Source != nil && (spec.Source.PVC != nil || spec.Source.Snapshot != nil))
	if spec.PVC != nil {
		errs = append(errs, validateClaimSpec(spec.PVC, path.Child("pvc"), cloning)...)
	}
	if spec.Storage != nil {
		errs = append(errs, validateStorageSpec(spec.Storage, path.Child("storage"), cloning)...)
	}
	switch spec.ContentType {
	case "", cdiv1.DataVolumeKubeVirt:
	case cdiv1.DataVolumeArchive:
		if spec.Source != nil && spec.Source.HTTP == nil && spec.Source.Upload == nil {
			errs = append(errs, field.Invalid(path.Child("contentType"), spec.ContentType, "archive content is supported only with the http and upload sources"))
		}
		if volumeMode(spec) == corev1.PersistentVolumeBlock {
			errs = append(errs, field.Invalid(path.Child("contentType"), spec.ContentType, "archive content needs a Filesystem volume, not Block"))
		}
	default:
		errs = append(errs, field.NotSupported(path.Child("contentType"), spec.ContentType, []string{string(cdiv1.DataVolumeKubeVirt), string(cdiv1.DataVolumeArchive)}))
	}
	if len(spec.Checkpoints) > 0 {
		if spec.Source == nil || (spec.Source.VDDK == nil && spec.Source.Imageio == nil) {
			errs = append(errs, field.Invalid(path.Child("checkpoints"), len(spec.Checkpoints), "checkpoints (multi-stage import) are supported only with the vddk and imageio sources"))
		}
		for i, c := range spec.Checkpoints {
			if c.Current == "" {
				errs = append(errs, field.Required(path.Child("checkpoints").Index(i).Child("current"), "the snapshot of this stage"))
			}
			if i > 0 && c.Previous == "" {
				errs = append(errs, field.Required(path.Child("checkpoints").Index(i).Child("previous"), "every stage after the first names the previous snapshot"))
			}
		}
	}
	if spec.PriorityClassName != "" {
		for _, m := range validation.IsDNS1123Subdomain(spec.PriorityClassName) {
			errs = append(errs, field.Invalid(path.Child("priorityClassName"), spec.PriorityClassName, m))
		}
	}
	return errs
}

func volumeMode(spec *cdiv1.DataVolumeSpec) corev1.PersistentVolumeMode {
	switch {
	case spec.PVC != nil && spec.PVC.VolumeMode != nil:
		return *spec.PVC.VolumeMode
	case spec.Storage != nil && spec.Storage.VolumeMode != nil:
		return *spec.Storage.VolumeMode
	}
	return ""
}

func validateSource(src *cdiv1.DataVolumeSource, path *field.Path) field.ErrorList {
	var errs field.ErrorList
	var set []string
	for name, present := range map[string]bool{
		"http": src.HTTP != nil, "s3": src.S3 != nil, "gcs": src.GCS != nil, "registry": src.Registry != nil,
		"pvc": src.PVC != nil, "upload": src.Upload != nil, "blank": src.Blank != nil, "imageio": src.Imageio != nil,
		"vddk": src.VDDK != nil, "snapshot": src.Snapshot != nil,
	} {
		if present {
			set = append(set, name)
		}
	}
	if len(set) != 1 {
		errs = append(errs, field.Invalid(path, strings.Join(sortedCopy(set), ","), "spec.source must name exactly one of http, s3, gcs, registry, pvc, upload, blank, imageio, vddk or snapshot"))
		return errs
	}
	switch {
	case src.HTTP != nil:
		p := path.Child("http")
		errs = append(errs, validateURL(src.HTTP.URL, p.Child("url"), "http", "https")...)
		if src.HTTP.Checksum != "" {
			if err := ValidateChecksum(src.HTTP.Checksum); err != nil {
				errs = append(errs, field.Invalid(p.Child("checksum"), src.HTTP.Checksum, err.Error()))
			}
		}
		for i, h := range src.HTTP.ExtraHeaders {
			if name, _, ok := strings.Cut(h, ":"); !ok || strings.TrimSpace(name) == "" {
				errs = append(errs, field.Invalid(p.Child("extraHeaders").Index(i), h, `want "Name: value"`))
			}
		}
		errs = append(errs, validateObjectName(src.HTTP.SecretRef, p.Child("secretRef"))...)
		errs = append(errs, validateObjectName(src.HTTP.CertConfigMap, p.Child("certConfigMap"))...)
	case src.S3 != nil:
		p := path.Child("s3")
		errs = append(errs, validateURL(src.S3.URL, p.Child("url"), "s3", "http", "https")...)
		errs = append(errs, validateObjectName(src.S3.SecretRef, p.Child("secretRef"))...)
		errs = append(errs, validateObjectName(src.S3.CertConfigMap, p.Child("certConfigMap"))...)
	case src.GCS != nil:
		p := path.Child("gcs")
		errs = append(errs, validateURL(src.GCS.URL, p.Child("url"), "gs", "https")...)
		errs = append(errs, validateObjectName(src.GCS.SecretRef, p.Child("secretRef"))...)
	case src.Registry != nil:
		errs = append(errs, validateRegistry(src.Registry, path.Child("registry"))...)
	case src.PVC != nil:
		p := path.Child("pvc")
		if src.PVC.Name == "" {
			errs = append(errs, field.Required(p.Child("name"), "the claim to clone"))
		}
		errs = append(errs, validateObjectName(src.PVC.Name, p.Child("name"))...)
		errs = append(errs, validateNamespace(src.PVC.Namespace, p.Child("namespace"))...)
	case src.Snapshot != nil:
		p := path.Child("snapshot")
		if src.Snapshot.Name == "" {
			errs = append(errs, field.Required(p.Child("name"), "the VolumeSnapshot to clone"))
		}
		errs = append(errs, validateObjectName(src.Snapshot.Name, p.Child("name"))...)
		errs = append(errs, validateNamespace(src.Snapshot.Namespace, p.Child("namespace"))...)
	case src.Imageio != nil:
		p := path.Child("imageio")
		errs = append(errs, validateURL(src.Imageio.URL, p.Child("url"), "http", "https")...)
		if src.Imageio.DiskID == "" {
			errs = append(errs, field.Required(p.Child("diskId"), "the oVirt disk to import"))
		}
		if src.Imageio.SecretRef == "" {
			errs = append(errs, field.Required(p.Child("secretRef"), "the Secret with the oVirt credentials"))
		}
		errs = append(errs, validateObjectName(src.Imageio.SecretRef, p.Child("secretRef"))...)
		errs = append(errs, validateObjectName(src.Imageio.CertConfigMap, p.Child("certConfigMap"))...)
	case src.VDDK != nil:
		p := path.Child("vddk")
		errs = append(errs, validateURL(src.VDDK.URL, p.Child("url"), "https", "http")...)
		for name, v := range map[string]string{"uuid": src.VDDK.UUID, "backingFile": src.VDDK.BackingFile, "secretRef": src.VDDK.SecretRef} {
			if v == "" {
				errs = append(errs, field.Required(p.Child(name), "required for a vddk import"))
			}
		}
	}
	return errs
}

func validateRegistry(r *cdiv1.DataVolumeSourceRegistry, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	hasURL := r.URL != nil && *r.URL != ""
	hasStream := r.ImageStream != nil && *r.ImageStream != ""
	if hasURL == hasStream {
		errs = append(errs, field.Invalid(p, "", "registry source needs exactly one of url or imageStream"))
	}
	if hasURL {
		u := *r.URL
		scheme, rest, ok := strings.Cut(u, "://")
		switch {
		case !ok || (scheme != cdiv1.RegistrySchemeDocker && scheme != cdiv1.RegistrySchemeOci):
			errs = append(errs, field.Invalid(p.Child("url"), u, "must start with docker:// or oci-archive://"))
		case rest == "":
			errs = append(errs, field.Invalid(p.Child("url"), u, "names no image"))
		}
	}
	if r.PullMethod != nil {
		switch *r.PullMethod {
		case cdiv1.RegistryPullPod, cdiv1.RegistryPullNode:
		default:
			errs = append(errs, field.NotSupported(p.Child("pullMethod"), *r.PullMethod, []string{string(cdiv1.RegistryPullPod), string(cdiv1.RegistryPullNode)}))
		}
	}
	if hasStream && (r.PullMethod == nil || *r.PullMethod != cdiv1.RegistryPullNode) {
		errs = append(errs, field.Invalid(p.Child("imageStream"), *r.ImageStream, "imageStream works only with pullMethod node"))
	}
	if hasURL && strings.HasPrefix(*r.URL, cdiv1.RegistrySchemeOci+"://") && r.PullMethod != nil && *r.PullMethod == cdiv1.RegistryPullNode {
		errs = append(errs, field.Invalid(p.Child("pullMethod"), *r.PullMethod, "oci-archive:// urls cannot be pulled by the node"))
	}
	if r.SecretRef != nil {
		errs = append(errs, validateObjectName(*r.SecretRef, p.Child("secretRef"))...)
	}
	if r.CertConfigMap != nil {
		errs = append(errs, validateObjectName(*r.CertConfigMap, p.Child("certConfigMap"))...)
	}
	return errs
}

func validateURL(raw string, p *field.Path, schemes ...string) field.ErrorList {
	if raw == "" {
		return field.ErrorList{field.Required(p, "a URL")}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return field.ErrorList{field.Invalid(p, raw, "not a URL: "+err.Error())}
	}
	for _, s := range schemes {
		if strings.EqualFold(u.Scheme, s) {
			if u.Host == "" {
				return field.ErrorList{field.Invalid(p, raw, "names no host")}
			}
			return nil
		}
	}
	return field.ErrorList{field.Invalid(p, raw, "scheme must be one of "+strings.Join(schemes, ", "))}
}

func validateObjectName(name string, p *field.Path) field.ErrorList {
	if name == "" {
		return nil
	}
	var errs field.ErrorList
	for _, m := range validation.IsDNS1123Subdomain(name) {
		errs = append(errs, field.Invalid(p, name, m))
	}
	return errs
}

func validateNamespace(ns string, p *field.Path) field.ErrorList {
	if ns == "" {
		return nil
	}
	var errs field.ErrorList
	for _, m := range validation.IsDNS1123Label(ns) {
		errs = append(errs, field.Invalid(p, ns, m))
	}
	return errs
}

var checksumLengths = map[string]int{"md5": 32, "sha1": 40, "sha256": 64, "sha512": 128}
var hexRE = regexp.MustCompile(`^[0-9a-fA-F]+$`)

// ValidateChecksum checks an "algo:hex" checksum.
func ValidateChecksum(sum string) error {
	algo, hex, ok := strings.Cut(sum, ":")
	if !ok {
		return fmt.Errorf(`want "algorithm:hex", e.g. sha256:<64 hex digits>`)
	}
	n, known := checksumLengths[strings.ToLower(algo)]
	if !known {
		return fmt.Errorf("unsupported checksum algorithm %q (md5, sha1, sha256, sha512)", algo)
	}
	if len(hex) != n || !hexRE.MatchString(hex) {
		return fmt.Errorf("%s checksum needs %d hex digits, got %q", algo, n, hex)
	}
	return nil
}

var validAccessModes = []string{string(corev1.ReadWriteOnce), string(corev1.ReadOnlyMany), string(corev1.ReadWriteMany), string(corev1.ReadWriteOncePod)}

func validateAccessModes(modes []corev1.PersistentVolumeAccessMode, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, m := range modes {
		ok := false
		for _, v := range validAccessModes {
			if string(m) == v {
				ok = true
			}
		}
		if !ok {
			errs = append(errs, field.NotSupported(p.Index(i), m, validAccessModes))
		}
	}
	return errs
}

func validateSize(requests corev1.ResourceList, p *field.Path, required bool) field.ErrorList {
	q, ok := requests[corev1.ResourceStorage]
	if !ok {
		if required {
			return field.ErrorList{field.Required(p.Child("resources", "requests", "storage"), "the size of the volume, e.g. 10Gi")}
		}
		return nil
	}
	if q.Sign() <= 0 {
		return field.ErrorList{field.Invalid(p.Child("resources", "requests", "storage"), q.String(), "must be greater than zero")}
	}
	return nil
}

func validateVolumeMode(mode *corev1.PersistentVolumeMode, p *field.Path, allowProfile bool) field.ErrorList {
	if mode == nil {
		return nil
	}
	valid := []string{string(corev1.PersistentVolumeFilesystem), string(corev1.PersistentVolumeBlock)}
	if allowProfile {
		valid = append(valid, string(cdiv1.PersistentVolumeFromStorageProfile))
	}
	for _, v := range valid {
		if string(*mode) == v {
			return nil
		}
	}
	return field.ErrorList{field.NotSupported(p.Child("volumeMode"), *mode, valid)}
}

// validateClaimSpec: spec.pvc is used as written, so it must be complete
// (access modes and, unless the size comes from a clone source, a size).
func validateClaimSpec(s *corev1.PersistentVolumeClaimSpec, p *field.Path, cloning bool) field.ErrorList {
	var errs field.ErrorList
	if len(s.AccessModes) == 0 {
		errs = append(errs, field.Required(p.Child("accessModes"), "spec.pvc is used as written and needs at least one access mode (use spec.storage to take them from the StorageProfile)"))
	}
	errs = append(errs, validateAccessModes(s.AccessModes, p.Child("accessModes"))...)
	errs = append(errs, validateSize(s.Resources.Requests, p, !cloning)...)
	errs = append(errs, validateVolumeMode(s.VolumeMode, p, false)...)
	if s.DataSource != nil || s.DataSourceRef != nil {
		errs = append(errs, field.Forbidden(p.Child("dataSourceRef"), "Kubefill sets the claim's data source itself; use spec.source instead"))
	}
	return errs
}

func validateStorageSpec(s *cdiv1.StorageSpec, p *field.Path, cloning bool) field.ErrorList {
	var errs field.ErrorList
	errs = append(errs, validateAccessModes(s.AccessModes, p.Child("accessModes"))...)
	// The size may come from the clone source; for every other source it is needed.
	errs = append(errs, validateSize(s.Resources.Requests, p, !cloning)...)
	errs = append(errs, validateVolumeMode(s.VolumeMode, p, true)...)
	if s.DataSource != nil || s.DataSourceRef != nil {
		errs = append(errs, field.Forbidden(p.Child("dataSourceRef"), "Kubefill sets the claim's data source itself; use spec.source instead"))
	}
	return errs
}

// ValidateDataVolumeUpdate allows no spec change after creation except the
// checkpoints of a multi-stage (vddk or imageio) import, as CDI does.
func ValidateDataVolumeUpdate(dv, old *cdiv1.DataVolume) field.ErrorList {
	if apiequality.Semantic.DeepEqual(dv.Spec, old.Spec) {
		return nil
	}
	multiStage := dv.Spec.Source != nil && len(dv.Spec.Checkpoints) > 0 && (dv.Spec.Source.VDDK != nil || dv.Spec.Source.Imageio != nil)
	if multiStage {
		a, b := dv.Spec.DeepCopy(), old.Spec.DeepCopy()
		a.Checkpoints, a.FinalCheckpoint = nil, false
		b.Checkpoints, b.FinalCheckpoint = nil, false
		if apiequality.Semantic.DeepEqual(a, b) {
			return nil
		}
	}
	return field.ErrorList{field.Forbidden(field.NewPath("spec"), "the spec of a DataVolume cannot change after creation (only checkpoints and finalCheckpoint of a multi-stage import may)")}
}

// ValidateCloneTokenUpdate refuses, on an update of a DataVolume by user,
// a change to its clone tokens: the short token is the mutating webhook's
// at creation and never changes (the controller never writes it); the
// extended token is the controller's, controllerUser, alone. A token set
// after admission would otherwise make the controller clone a source
// nobody authorised for this DataVolume. Removing the extended token is
// a change like any other. Pure.
func ValidateCloneTokenUpdate(dv, old *cdiv1.DataVolume, user, controllerUser string) field.ErrorList {
	var errs field.ErrorList
	ann := field.NewPath("metadata", "annotations")
	changed := func(key string) bool {
		a, inNew := dv.Annotations[key]
		b, inOld := old.Annotations[key]
		return a != b || inNew != inOld
	}
	if changed(cdiv1.AnnCloneToken) {
		errs = append(errs, field.Forbidden(ann.Key(cdiv1.AnnCloneToken),
			"the clone token is set once, by the DataVolume webhook when the DataVolume is created, for the user who creates it, and cannot be set, changed or removed afterwards; "+
				"to clone another source, create a new DataVolume"))
	}
	if changed(cdiv1.AnnExtendedCloneToken) && (controllerUser == "" || user != controllerUser) {
		who := "the Kubefill controller"
		if controllerUser != "" {
			who += " (" + controllerUser + ")"
		}
		errs = append(errs, field.Forbidden(ann.Key(cdiv1.AnnExtendedCloneToken),
			fmt.Sprintf("only %s sets the extended clone token, after it checked the DataVolume's clone token; user %q may not set, change or remove it", who, user)))
	}
	return errs
}

// DataVolumeValidator is the validating webhook for DataVolumes.
type DataVolumeValidator struct {
	// Client reads PVCs (may be nil to skip the existing-claim check).
	Client client.Reader
	// ControllerUser is the user name of `kubefill controller`, the only
	// identity that may change a DataVolume's extended clone token (empty:
	// nobody may).
	ControllerUser string
}

// Admit implements AdmitFunc.
func (v *DataVolumeValidator) Admit(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Kind.Group != cdiv1.GroupName || req.Kind.Kind != "DataVolume" {
		return badRequest(fmt.Sprintf("this webhook validates DataVolumes, not %s", req.Kind.String()))
	}
	if req.Operation == admissionv1.Delete || req.Operation == admissionv1.Connect {
		return allowed()
	}
	var dv cdiv1.DataVolume
	if err := json.Unmarshal(req.Object.Raw, &dv); err != nil {
		return badRequest("cannot decode the DataVolume (a size must be a quantity such as 10Gi): " + err.Error())
	}
	name := dv.Name
	if name == "" {
		name = req.Name
	}
	if req.Operation == admissionv1.Update {
		var old cdiv1.DataVolume
		if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil {
			return badRequest("cannot decode the old DataVolume: " + err.Error())
		}
		errs := ValidateDataVolumeUpdate(&dv, &old)
		errs = append(errs, ValidateCloneTokenUpdate(&dv, &old, req.UserInfo.Username, v.ControllerUser)...)
		if len(errs) > 0 {
			return denied("DataVolume", name, errs)
		}
		// An unchanged spec was valid when it was created; rules added since
		// must not block status or metadata updates of existing objects.
		return allowed()
	}
	errs := ValidateDataVolumeSpec(&dv.Spec, field.NewPath("spec"))
	if len(name) > validation.DNS1123LabelMaxLength && dv.GenerateName == "" {
		// The claim and the worker pods are named after the DataVolume.
		errs = append(errs, field.TooLong(field.NewPath("metadata", "name"), name, validation.DNS1123LabelMaxLength))
	}
	if len(errs) > 0 {
		return denied("DataVolume", name, errs)
	}
	if v.Client != nil && name != "" {
		var pvc corev1.PersistentVolumeClaim
		err := v.Client.Get(ctx, types.NamespacedName{Namespace: req.Namespace, Name: name}, &pvc)
		switch {
		case err == nil:
			owner := metav1.GetControllerOf(&pvc)
			_, prePopulated := pvc.Annotations[cdiv1.AnnPrePopulated]
			if prePopulated {
				// A claim Kubefill adopted before, whose DataVolume is made again.
				break
			}
			config := &cdiv1.CDIConfig{}
			if err := v.Client.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, config); err != nil {
				if !apierrors.IsNotFound(err) {
					return internalError(fmt.Errorf("reading CDIConfig for its feature gates: %w", err))
				}
				config = nil
			}
			named := dv.DeepCopy()
			named.Name = name
			if cdiv1.ClaimMayExistBeforeDataVolume(&pvc, named, cdiv1.FeatureGateEnabled(config, cdiv1.FeatureGateDataVolumeClaimAdoption)) {
				// A claim filled ahead of time for this DataVolume, or one it
				// may adopt; the controller refuses one another controller owns.
				break
			}
			if owner == nil || owner.Kind != "DataVolume" || owner.APIVersion != cdiv1.SchemeGroupVersion.String() {
				return denied("DataVolume", name, field.ErrorList{field.Duplicate(field.NewPath("metadata", "name"),
					fmt.Sprintf("PersistentVolumeClaim %s/%s already exists and is not owned by a DataVolume", req.Namespace, name))})
			}
		case !apierrors.IsNotFound(err):
			return internalError(fmt.Errorf("checking for an existing claim %s/%s: %w", req.Namespace, name, err))
		}
	}
	return allowed()
}

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}
