// Package contract is what the controller and its worker pods (importer,
// upload server, cloner) agree on: environment variable names, paths inside
// the pod, ports, the termination message and the progress metrics. Both
// sides import it, and neither imports the other.
package contract

// Environment variable names of the importer pod. CDI's names where CDI has
// one; IMPORTER_CHECKSUM, IMPORTER_SECRET_EXTRA_HEADERS_DIR and
// IMPORTER_REGISTRY_IMAGE_ARCHITECTURE are Kubefill's.
const (
	EnvSource                = "IMPORTER_SOURCE"
	EnvEndpoint              = "IMPORTER_ENDPOINT"
	EnvContentType           = "IMPORTER_CONTENTTYPE"
	EnvImageSize             = "IMPORTER_IMAGE_SIZE"
	EnvAccessKeyID           = "IMPORTER_ACCESS_KEY_ID"
	EnvSecretKey             = "IMPORTER_SECRET_KEY"
	EnvCertDir               = "IMPORTER_CERT_DIR"
	EnvInsecureTLS           = "INSECURE_TLS"
	EnvProxyCertDir          = "IMPORTER_PROXY_CERT_DIR"
	EnvHTTPProxy             = "http_proxy"
	EnvHTTPSProxy            = "https_proxy"
	EnvNoProxy               = "no_proxy"
	EnvExtraHeaderPrefix     = "IMPORTER_EXTRA_HEADER_"
	EnvSecretExtraHeadersDir = "IMPORTER_SECRET_EXTRA_HEADERS_DIR"
	EnvChecksum              = "IMPORTER_CHECKSUM"
	EnvRegistryArchitecture  = "IMPORTER_REGISTRY_IMAGE_ARCHITECTURE"
	EnvFilesystemOverhead    = "FILESYSTEM_OVERHEAD"
	EnvPreallocation         = "PREALLOCATION"
	EnvOwnerUID              = "OWNER_UID"
)

// Source kinds, the IMPORTER_SOURCE values (as in CDI).
const (
	SourceHTTP     = "http"
	SourceS3       = "s3"
	SourceRegistry = "registry"
	SourceNone     = "none"
)

// Paths inside a worker pod, as in CDI.
const (
	DataDir        = "/data"
	DataPath       = DataDir + "/disk.img"
	BlockPath      = "/dev/cdi-block-volume"
	ScratchDir     = "/scratch"
	TerminationLog = "/dev/termination-log"
	CertDir        = "/certs"
	// ProxyCertDir holds the import proxy's CA bundle (CDIConfig
	// importProxy.trustedCAProxy).
	ProxyCertDir     = "/proxycerts"
	SecretHeadersDir = "/extraheaders"
	// UploadTLSDir holds an upload pod's serving certificate and client CA.
	UploadTLSDir = "/etc/kubefill/upload-tls"
)

// Volume names in a worker pod, as CDI names them.
const (
	DataVolumeName    = "cdi-data-vol"
	ScratchVolumeName = "cdi-scratch-vol"
	CertVolumeName    = "cdi-cert-vol"
	ProxyCertVolume   = "cdi-proxy-cert-vol"
	UploadTLSVolume   = "upload-tls"
)

// Ports.
const (
	// MetricsPort is where the importer serves its progress over TLS.
	MetricsPort = 8443
	// UploadServerPort is the upload server's TLS port in the pod; its
	// Service listens on UploadServicePort.
	UploadServerPort  = 8443
	UploadServicePort = 443
)

// DefaultImage is the worker image when the controller is given none.
const DefaultImage = "kubefill/kubefill:dev"

// WorkerUID is the user and group worker pods run as: CDI's (qemu's uid on
// the nodes KubeVirt runs on), so volumes a worker fills are the VM's to
// read. The image's default user is the same.
const WorkerUID = 107

// DefaultFilesystemOverhead is the share of a Filesystem volume kept free
// when CDIConfig says nothing (CDI's default).
const DefaultFilesystemOverhead = 0.06

// ImagePullFailureText begins the importer's message when a registry
// source's image cannot be pulled. The DataVolume's Running condition then
// has reason ImagePullFailed, which KubeVirt shows as DataVolumeError (CDI
// matches the same text in the termination message).
const ImagePullFailureText = "failed to pull image"

// Progress metrics, percentages labelled ownerUID, as CDI names them.
const (
	ImportProgressMetric = "kubevirt_cdi_import_progress_total"
	CloneProgressMetric  = "kubevirt_cdi_clone_progress_total"
)

// The clone source pod's environment (CDI's cloner names), and the one
// Kubefill adds: UPLOAD_SERVER_NAME, the name to verify the upload
// server's certificate against when UPLOAD_URL dials its pod's address, so
// that a clone needs neither cluster DNS nor a Service proxy.
const (
	EnvCloneVolumeMode    = "VOLUME_MODE"
	EnvCloneMountPoint    = "MOUNT_POINT"
	EnvCloneUploadURL     = "UPLOAD_URL"
	EnvCloneUploadServer  = "UPLOAD_SERVER_NAME"
	EnvCloneOwnerUID      = "OWNER_UID"
	EnvClonePreallocation = "PREALLOCATION"
	EnvCloneServerCACert  = "SERVER_CA_CERT"
	EnvCloneClientCert    = "CLIENT_CERT"
	EnvCloneClientKey     = "CLIENT_KEY"
	CloneSourceMountPoint = "/var/run/cdi/clone/source"
	CloneUploadPath       = "/v1beta1/upload"
	MessageCloneComplete  = "Clone Complete"
)
