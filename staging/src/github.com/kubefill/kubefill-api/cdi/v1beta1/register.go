package v1beta1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group CDI defined and Kubefill serves.
const GroupName = "cdi.kubevirt.io"

// SchemeGroupVersion is the group and version of every type in this package.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1beta1"}

var (
	// SchemeBuilder registers this package's types with a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds this package's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Resource turns an unqualified resource name into a GroupResource.
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion,
		&DataVolume{}, &DataVolumeList{},
		&DataSource{}, &DataSourceList{},
		&DataImportCron{}, &DataImportCronList{},
		&VolumeImportSource{}, &VolumeImportSourceList{},
		&VolumeUploadSource{}, &VolumeUploadSourceList{},
		&VolumeCloneSource{}, &VolumeCloneSourceList{},
		&StorageProfile{}, &StorageProfileList{},
		&CDIConfig{}, &CDIConfigList{},
		&CDI{}, &CDIList{},
	)
	metav1.AddToGroupVersion(scheme, SchemeGroupVersion)
	return nil
}
