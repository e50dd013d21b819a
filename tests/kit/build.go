package kit

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// Size is a storage request of size ("1Gi").
func Size(size string) corev1.VolumeResourceRequirements {
	return corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}
}

// ClaimOption sets one thing on a claim PVC or ClaimSpec builds.
type ClaimOption func(*corev1.PersistentVolumeClaim)

// Class sets the claim's StorageClass.
func Class(name string) ClaimOption {
	return func(p *corev1.PersistentVolumeClaim) { p.Spec.StorageClassName = ptr.To(name) }
}

// Mode sets the claim's volume mode.
func Mode(mode corev1.PersistentVolumeMode) ClaimOption {
	return func(p *corev1.PersistentVolumeClaim) { p.Spec.VolumeMode = ptr.To(mode) }
}

// SourceRef points the claim's dataSourceRef at a cdi.kubevirt.io object of
// kind in the claim's namespace.
func SourceRef(kind, name string) ClaimOption {
	return func(p *corev1.PersistentVolumeClaim) {
		p.Spec.DataSourceRef = &corev1.TypedObjectReference{APIGroup: ptr.To(cdiv1.GroupName), Kind: kind, Name: name}
	}
}

// Annotate adds annotations to the claim (none leaves them nil).
func Annotate(annotations map[string]string) ClaimOption {
	return func(p *corev1.PersistentVolumeClaim) {
		if len(annotations) == 0 {
			return
		}
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		for k, v := range annotations {
			p.Annotations[k] = v
		}
	}
}

// PVC is a ReadWriteOnce claim ns/name requesting size, with opts applied.
func PVC(ns, name, size string, opts ...ClaimOption) *corev1.PersistentVolumeClaim {
	p := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   Size(size),
		},
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

// ClaimSpec is the spec of PVC("", "", size, opts...), for a DataVolume's
// pvc field.
func ClaimSpec(size string, opts ...ClaimOption) *corev1.PersistentVolumeClaimSpec {
	return &PVC("", "", size, opts...).Spec
}

// HTTP is a DataVolume source that imports url.
func HTTP(url string) *cdiv1.DataVolumeSource {
	return &cdiv1.DataVolumeSource{HTTP: &cdiv1.DataVolumeSourceHTTP{URL: url}}
}

// Upload is a DataVolume source that waits for an upload.
func Upload() *cdiv1.DataVolumeSource {
	return &cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}}
}

// Blank is a DataVolume source for an empty image.
func Blank() *cdiv1.DataVolumeSource {
	return &cdiv1.DataVolumeSource{Blank: &cdiv1.DataVolumeBlankImage{}}
}

// DataVolumeOption sets one thing on a DataVolume that DataVolume builds.
type DataVolumeOption func(*cdiv1.DataVolume)

// WithPVC gives the DataVolume a pvc spec, used as it is.
func WithPVC(spec *corev1.PersistentVolumeClaimSpec) DataVolumeOption {
	return func(dv *cdiv1.DataVolume) { dv.Spec.PVC = spec }
}

// WithStorage gives the DataVolume a storage spec requesting size of class
// ("" leaves the class to the defaults).
func WithStorage(class, size string) DataVolumeOption {
	return func(dv *cdiv1.DataVolume) {
		dv.Spec.Storage = &cdiv1.StorageSpec{Resources: Size(size)}
		if class != "" {
			dv.Spec.Storage.StorageClassName = ptr.To(class)
		}
	}
}

// DataVolume is a DataVolume ns/name filled from src, with opts applied.
func DataVolume(ns, name string, src *cdiv1.DataVolumeSource, opts ...DataVolumeOption) *cdiv1.DataVolume {
	dv := &cdiv1.DataVolume{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       cdiv1.DataVolumeSpec{Source: src},
	}
	for _, o := range opts {
		o(dv)
	}
	return dv
}
