package admission

import (
	"context"
	"encoding/json"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/util/validation/field"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

const snapshotGroup = "snapshot.storage.k8s.io"

// ValidateVolumeImportSource checks a VolumeImportSource spec.
func ValidateVolumeImportSource(spec *cdiv1.VolumeImportSourceSpec) field.ErrorList {
	p := field.NewPath("spec")
	var errs field.ErrorList
	if spec.Source == nil {
		return field.ErrorList{field.Required(p.Child("source"), "one of http, s3, gcs, registry, blank, imageio or vddk")}
	}
	s := spec.Source
	// The import kinds are a subset of a DataVolume's sources; reuse those rules.
	dvSrc := &cdiv1.DataVolumeSource{HTTP: s.HTTP, S3: s.S3, GCS: s.GCS, Registry: s.Registry, Blank: s.Blank, Imageio: s.Imageio, VDDK: s.VDDK}
	for _, e := range validateSource(dvSrc, p.Child("source")) {
		if e.Field == p.Child("source").String() {
			e.Detail = "spec.source must name exactly one of http, s3, gcs, registry, blank, imageio or vddk"
		}
		errs = append(errs, e)
	}
	errs = append(errs, validateContentType(spec.ContentType, p.Child("contentType"), s.HTTP != nil)...)
	if len(spec.Checkpoints) > 0 && s.VDDK == nil && s.Imageio == nil {
		errs = append(errs, field.Invalid(p.Child("checkpoints"), len(spec.Checkpoints), "checkpoints are supported only with the vddk and imageio sources"))
	}
	if spec.TargetClaim != nil {
		errs = append(errs, validateObjectName(*spec.TargetClaim, p.Child("targetClaim"))...)
	}
	return errs
}

// ValidateVolumeUploadSource checks a VolumeUploadSource spec.
func ValidateVolumeUploadSource(spec *cdiv1.VolumeUploadSourceSpec) field.ErrorList {
	return validateContentType(spec.ContentType, field.NewPath("spec", "contentType"), true)
}

// ValidateVolumeCloneSource checks a VolumeCloneSource spec: the source is a
// PersistentVolumeClaim or a VolumeSnapshot in the populator's namespace.
func ValidateVolumeCloneSource(spec *cdiv1.VolumeCloneSourceSpec) field.ErrorList {
	p := field.NewPath("spec", "source")
	var errs field.ErrorList
	group := ""
	if spec.Source.APIGroup != nil {
		group = *spec.Source.APIGroup
	}
	switch {
	case spec.Source.Kind == "PersistentVolumeClaim" && group == "":
	case spec.Source.Kind == "VolumeSnapshot" && group == snapshotGroup:
	default:
		errs = append(errs, field.Invalid(p, fmt.Sprintf("%s (apiGroup %q)", spec.Source.Kind, group),
			"source must be a PersistentVolumeClaim (core group) or a VolumeSnapshot (apiGroup snapshot.storage.k8s.io)"))
	}
	if spec.Source.Name == "" {
		errs = append(errs, field.Required(p.Child("name"), "the object to clone"))
	}
	errs = append(errs, validateObjectName(spec.Source.Name, p.Child("name"))...)
	if spec.PriorityClassName != nil {
		errs = append(errs, validateObjectName(*spec.PriorityClassName, field.NewPath("spec", "priorityClassName"))...)
	}
	return errs
}

func validateContentType(ct cdiv1.DataVolumeContentType, p *field.Path, archiveOK bool) field.ErrorList {
	switch ct {
	case "", cdiv1.DataVolumeKubeVirt:
		return nil
	case cdiv1.DataVolumeArchive:
		if !archiveOK {
			return field.ErrorList{field.Invalid(p, ct, "archive content is supported only with the http and upload sources")}
		}
		return nil
	}
	return field.ErrorList{field.NotSupported(p, ct, []string{string(cdiv1.DataVolumeKubeVirt), string(cdiv1.DataVolumeArchive)})}
}

// AdmitPopulator is the validating webhook for the three populator source kinds.
func AdmitPopulator(_ context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	if req.Kind.Group != cdiv1.GroupName {
		return badRequest(fmt.Sprintf("this webhook validates populator sources, not %s", req.Kind.String()))
	}
	if req.Operation != admissionv1.Create && req.Operation != admissionv1.Update {
		return allowed()
	}
	decode := func(raw []byte, into any) error { return json.Unmarshal(raw, into) }
	var (
		errs             field.ErrorList
		name             string
		newSpec, oldSpec any
	)
	switch req.Kind.Kind {
	case cdiv1.VolumeImportSourceRef:
		var o, old cdiv1.VolumeImportSource
		if err := decode(req.Object.Raw, &o); err != nil {
			return badRequest("cannot decode the VolumeImportSource: " + err.Error())
		}
		name, newSpec, errs = o.Name, o.Spec, ValidateVolumeImportSource(&o.Spec)
		if req.Operation == admissionv1.Update {
			if err := decode(req.OldObject.Raw, &old); err != nil {
				return badRequest("cannot decode the old VolumeImportSource: " + err.Error())
			}
			oldSpec = old.Spec
		}
	case cdiv1.VolumeUploadSourceRef:
		var o, old cdiv1.VolumeUploadSource
		if err := decode(req.Object.Raw, &o); err != nil {
			return badRequest("cannot decode the VolumeUploadSource: " + err.Error())
		}
		name, newSpec, errs = o.Name, o.Spec, ValidateVolumeUploadSource(&o.Spec)
		if req.Operation == admissionv1.Update {
			if err := decode(req.OldObject.Raw, &old); err != nil {
				return badRequest("cannot decode the old VolumeUploadSource: " + err.Error())
			}
			oldSpec = old.Spec
		}
	case cdiv1.VolumeCloneSourceRef:
		var o, old cdiv1.VolumeCloneSource
		if err := decode(req.Object.Raw, &o); err != nil {
			return badRequest("cannot decode the VolumeCloneSource: " + err.Error())
		}
		name, newSpec, errs = o.Name, o.Spec, ValidateVolumeCloneSource(&o.Spec)
		if req.Operation == admissionv1.Update {
			if err := decode(req.OldObject.Raw, &old); err != nil {
				return badRequest("cannot decode the old VolumeCloneSource: " + err.Error())
			}
			oldSpec = old.Spec
		}
	default:
		return badRequest(fmt.Sprintf("this webhook validates populator sources, not %s", req.Kind.String()))
	}
	if req.Operation == admissionv1.Update {
		// A claim may be half-populated from the old spec; changing it would mix two sources.
		if !apiequality.Semantic.DeepEqual(newSpec, oldSpec) {
			return denied(req.Kind.Kind, name, field.ErrorList{field.Forbidden(field.NewPath("spec"), "the spec of a populator source cannot change after creation")})
		}
		return allowed()
	}
	if len(errs) > 0 {
		return denied(req.Kind.Kind, name, errs)
	}
	return allowed()
}
