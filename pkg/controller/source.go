package controller

import cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"

// describeSource names a DataVolume's source kind for logs.
func describeSource(dv *cdiv1.DataVolume) string {
	if dv.Spec.SourceRef != nil {
		return "sourceRef:" + dv.Spec.SourceRef.Kind
	}
	s := dv.Spec.Source
	switch {
	case s == nil:
		return "none"
	case s.HTTP != nil:
		return "http"
	case s.S3 != nil:
		return "s3"
	case s.GCS != nil:
		return "gcs"
	case s.Registry != nil:
		return "registry"
	case s.PVC != nil:
		return "pvc"
	case s.Snapshot != nil:
		return "snapshot"
	case s.Upload != nil:
		return "upload"
	case s.Blank != nil:
		return "blank"
	case s.Imageio != nil:
		return "imageio"
	case s.VDDK != nil:
		return "vddk"
	}
	return "unknown"
}
