// Package uploadcli is `kubefill upload`: virtctl image-upload's shape. It
// creates a DataVolume or PVC that accepts an upload, gets a token through
// the UploadTokenRequest API, waits for the upload pod, streams the file to
// the upload proxy with a progress bar, and waits for the data to be written.
package uploadcli

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// Kinds of object to upload into.
const (
	KindDataVolume = "dv"
	KindPVC        = "pvc"
)

// Options are the command line of `kubefill upload`.
type Options struct {
	Kind      string // KindDataVolume or KindPVC
	Name      string
	Namespace string

	ImagePath   string
	ArchivePath string
	Size        string

	StorageClass string
	AccessMode   string
	VolumeMode   string

	ProxyURL string
	Insecure bool
	CACert   string

	NoCreate  bool
	ForceBind bool
	WaitSecs  int
	Retry     int
}

// NormalizeKind accepts the spellings virtctl does.
func NormalizeKind(s string) (string, error) {
	switch strings.ToLower(s) {
	case "dv", "datavolume", "data-volume", "datavolumes":
		return KindDataVolume, nil
	case "pvc", "persistentvolumeclaim", "pvcs":
		return KindPVC, nil
	}
	return "", fmt.Errorf("unknown kind %q: upload into a \"dv\" (DataVolume) or a \"pvc\" (PersistentVolumeClaim)", s)
}

// Path is the file to upload.
func (o *Options) Path() string {
	if o.ArchivePath != "" {
		return o.ArchivePath
	}
	return o.ImagePath
}

// Archive says whether the file is a tar archive to unpack onto a Filesystem volume.
func (o *Options) Archive() bool { return o.ArchivePath != "" }

// Validate checks the options alone, without files or the cluster.
func (o *Options) Validate() error {
	var errs []error
	if o.Kind != KindDataVolume && o.Kind != KindPVC {
		errs = append(errs, fmt.Errorf("kind must be %q or %q, not %q", KindDataVolume, KindPVC, o.Kind))
	}
	if o.Name == "" {
		errs = append(errs, errors.New("the name of the DataVolume or PVC is required"))
	}
	switch {
	case o.ImagePath == "" && o.ArchivePath == "":
		errs = append(errs, errors.New("give the file to upload with --image-path (a disk image) or --archive-path (a tar archive)"))
	case o.ImagePath != "" && o.ArchivePath != "":
		errs = append(errs, errors.New("--image-path and --archive-path exclude each other"))
	}
	if o.NoCreate {
		if o.Size != "" || o.StorageClass != "" || o.AccessMode != "" || o.VolumeMode != "" || o.ForceBind {
			errs = append(errs, errors.New("--size, --storage-class, --access-mode, --volume-mode and --force-bind describe a new object and do not go with --no-create"))
		}
	} else {
		if o.Size == "" {
			errs = append(errs, errors.New("--size is required to create the DataVolume or PVC (e.g. --size=10Gi); use --no-create to upload into an existing one"))
		} else if q, err := resource.ParseQuantity(o.Size); err != nil {
			errs = append(errs, fmt.Errorf("--size %q is not a quantity such as 10Gi: %v", o.Size, err))
		} else if q.Sign() <= 0 {
			errs = append(errs, fmt.Errorf("--size %q must be positive", o.Size))
		}
	}
	if o.AccessMode != "" {
		if _, err := ParseAccessMode(o.AccessMode); err != nil {
			errs = append(errs, err)
		}
	}
	if o.VolumeMode != "" {
		m, err := ParseVolumeMode(o.VolumeMode)
		if err != nil {
			errs = append(errs, err)
		} else if m == corev1.PersistentVolumeBlock && o.Archive() {
			errs = append(errs, errors.New("--archive-path unpacks files and needs a Filesystem volume, not --volume-mode=block"))
		}
	}
	if o.ProxyURL != "" {
		if _, err := NormalizeProxyURL(o.ProxyURL); err != nil {
			errs = append(errs, err)
		}
	}
	if o.Insecure && o.CACert != "" {
		errs = append(errs, errors.New("--insecure and --ca-cert exclude each other"))
	}
	if o.WaitSecs < 0 {
		errs = append(errs, fmt.Errorf("--wait-secs %d is negative", o.WaitSecs))
	}
	if o.Retry < 0 {
		errs = append(errs, fmt.Errorf("--retry %d is negative", o.Retry))
	}
	return errors.Join(errs...)
}

// Wait is --wait-secs as a duration.
func (o *Options) Wait() time.Duration { return time.Duration(o.WaitSecs) * time.Second }

// ParseAccessMode accepts a Kubernetes access mode name.
func ParseAccessMode(s string) (corev1.PersistentVolumeAccessMode, error) {
	for _, m := range []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce, corev1.ReadOnlyMany, corev1.ReadWriteMany, corev1.ReadWriteOncePod} {
		if strings.EqualFold(s, string(m)) {
			return m, nil
		}
	}
	return "", fmt.Errorf("--access-mode %q is not one of ReadWriteOnce, ReadOnlyMany, ReadWriteMany, ReadWriteOncePod", s)
}

// ParseVolumeMode accepts block or filesystem, in any case.
func ParseVolumeMode(s string) (corev1.PersistentVolumeMode, error) {
	switch strings.ToLower(s) {
	case "block":
		return corev1.PersistentVolumeBlock, nil
	case "filesystem":
		return corev1.PersistentVolumeFilesystem, nil
	}
	return "", fmt.Errorf("--volume-mode %q is not block or filesystem", s)
}

// NormalizeProxyURL adds https:// to a bare host, as virtctl does, and
// refuses anything but an https base URL.
func NormalizeProxyURL(s string) (string, error) {
	if !strings.Contains(s, "://") {
		s = "https://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("upload proxy URL %q: %w", s, err)
	}
	if u.Scheme != "https" || u.Host == "" {
		return "", fmt.Errorf("upload proxy URL %q must be https://host[:port]", s)
	}
	return strings.TrimSuffix(u.String(), "/"), nil
}

// ProxyURLFromConfig picks the upload proxy URL from CDIConfig: the override
// wins over the URL Kubefill publishes.
func ProxyURLFromConfig(c *cdiv1.CDIConfig) (string, error) {
	if c != nil && c.Spec.UploadProxyURLOverride != nil && *c.Spec.UploadProxyURLOverride != "" {
		return NormalizeProxyURL(*c.Spec.UploadProxyURLOverride)
	}
	if c != nil && c.Status.UploadProxyURL != nil && *c.Status.UploadProxyURL != "" {
		return NormalizeProxyURL(*c.Status.UploadProxyURL)
	}
	return "", errors.New("the upload proxy URL is not published in CDIConfig \"config\" (status.uploadProxyURL or spec.uploadProxyURLOverride); pass --uploadproxy-url")
}

func (o *Options) contentType() cdiv1.DataVolumeContentType {
	if o.Archive() {
		return cdiv1.DataVolumeArchive
	}
	return cdiv1.DataVolumeKubeVirt
}

func (o *Options) annotations() map[string]string {
	if !o.ForceBind {
		return nil
	}
	return map[string]string{cdiv1.AnnImmediateBinding: "true"}
}

// DataVolume builds the DataVolume with source.upload that Validate'd options describe.
func (o *Options) DataVolume() (*cdiv1.DataVolume, error) {
	size, err := resource.ParseQuantity(o.Size)
	if err != nil {
		return nil, fmt.Errorf("--size: %w", err)
	}
	st := &cdiv1.StorageSpec{Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}}}
	if o.AccessMode != "" {
		m, err := ParseAccessMode(o.AccessMode)
		if err != nil {
			return nil, err
		}
		st.AccessModes = []corev1.PersistentVolumeAccessMode{m}
	}
	if o.VolumeMode != "" {
		m, err := ParseVolumeMode(o.VolumeMode)
		if err != nil {
			return nil, err
		}
		st.VolumeMode = &m
	}
	if o.StorageClass != "" {
		sc := o.StorageClass
		st.StorageClassName = &sc
	}
	dv := &cdiv1.DataVolume{
		TypeMeta:   metav1.TypeMeta{APIVersion: cdiv1.SchemeGroupVersion.String(), Kind: "DataVolume"},
		ObjectMeta: metav1.ObjectMeta{Name: o.Name, Namespace: o.Namespace, Annotations: o.annotations()},
		Spec: cdiv1.DataVolumeSpec{
			Source:  &cdiv1.DataVolumeSource{Upload: &cdiv1.DataVolumeSourceUpload{}},
			Storage: st,
		},
	}
	if o.Archive() {
		dv.Spec.ContentType = cdiv1.DataVolumeArchive
	}
	return dv, nil
}

// PVC builds the claim and the VolumeUploadSource its dataSourceRef names.
func (o *Options) PVC() (*corev1.PersistentVolumeClaim, *cdiv1.VolumeUploadSource, error) {
	size, err := resource.ParseQuantity(o.Size)
	if err != nil {
		return nil, nil, fmt.Errorf("--size: %w", err)
	}
	mode := corev1.ReadWriteOnce
	if o.AccessMode != "" {
		if mode, err = ParseAccessMode(o.AccessMode); err != nil {
			return nil, nil, err
		}
	}
	group := cdiv1.GroupName
	pvc := &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: o.Name, Namespace: o.Namespace, Annotations: o.annotations()},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:   []corev1.PersistentVolumeAccessMode{mode},
			Resources:     corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}},
			DataSourceRef: &corev1.TypedObjectReference{APIGroup: &group, Kind: cdiv1.VolumeUploadSourceRef, Name: o.Name},
		},
	}
	if o.VolumeMode != "" {
		m, err := ParseVolumeMode(o.VolumeMode)
		if err != nil {
			return nil, nil, err
		}
		pvc.Spec.VolumeMode = &m
	}
	if o.StorageClass != "" {
		sc := o.StorageClass
		pvc.Spec.StorageClassName = &sc
	}
	src := &cdiv1.VolumeUploadSource{
		TypeMeta:   metav1.TypeMeta{APIVersion: cdiv1.SchemeGroupVersion.String(), Kind: cdiv1.VolumeUploadSourceRef},
		ObjectMeta: metav1.ObjectMeta{Name: o.Name, Namespace: o.Namespace},
		Spec:       cdiv1.VolumeUploadSourceSpec{ContentType: o.contentType()},
	}
	return pvc, src, nil
}

// UploadPath is where the file goes: the archive path for an archive, else
// the async path when the proxy answers the probe, else the sync one.
func UploadPath(archive, asyncAvailable bool) string {
	switch {
	case archive:
		return "/v1beta1/upload-archive"
	case asyncAvailable:
		return "/v1beta1/upload-async"
	}
	return "/v1beta1/upload"
}
