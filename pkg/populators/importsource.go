package populators

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
)

// ImportKind fills a prime by running `kubefill importer` in a pod:
// prime → worker → rebind.
type ImportKind struct {
	Client client.Client
	// Reader reads the import proxy's CA ConfigMap without a cache; nil
	// uses Client.
	Reader client.Reader
	// Namespace is the controller's install namespace, where CDIConfig's
	// importProxy.trustedCAProxy ConfigMap lives.
	Namespace string
	// Image is the container image holding the kubefill binary.
	Image string
	// PullPolicy is the importer image's pull policy.
	PullPolicy corev1.PullPolicy
	// MetricsPort is where the importer serves its progress over TLS; zero
	// is contract.MetricsPort.
	MetricsPort int32
	// ScrapeProgress reads the importer's progress; nil uses HTTPS to the pod.
	ScrapeProgress func(ctx context.Context, pod *corev1.Pod, port int32) (float64, error)
	// MaxRetries bounds how often a failed, retryable import starts again;
	// negative is no bound.
	MaxRetries int32
	// Backoff is the wait before the first retry; it doubles each time, up
	// to MaxBackoff when that is set.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Name implements Kind.
func (k *ImportKind) Name() string { return cdiv1.VolumeImportSourceRef }

// GetSource implements Kind.
func (k *ImportKind) GetSource(ctx context.Context, key types.NamespacedName) (client.Object, error) {
	src := &cdiv1.VolumeImportSource{}
	if err := k.Client.Get(ctx, key, src); err != nil {
		return nil, err
	}
	return src, nil
}

// Plan implements Kind.
func (k *ImportKind) Plan() []Phase {
	return []Phase{
		&PrimePhase{Prepare: k.PreparePrime},
		&WorkerPhase{Client: k.Client, Worker: k, Image: k.Image, PullPolicy: k.PullPolicy, Now: k.Now,
			Retry: RetryPolicy{MaxRetries: int(k.MaxRetries), Backoff: k.Backoff, MaxBackoff: k.MaxBackoff}},
		&RebindPhase{},
	}
}

// ImportEndpoint is what an import source resolves to for the importer.
type ImportEndpoint struct {
	Source, URL, SecretRef, CertConfigMap, Checksum, Architecture string
	ExtraHeaders, SecretExtraHeaders                              []string
}

// ResolveImportSource turns a VolumeImportSource spec into the importer's
// endpoint, or explains why Kubefill cannot import it.
func ResolveImportSource(spec cdiv1.VolumeImportSourceSpec) (ImportEndpoint, error) {
	s := spec.Source
	switch {
	case s == nil:
		return ImportEndpoint{}, fmt.Errorf("the VolumeImportSource names no source")
	case s.HTTP != nil:
		return ImportEndpoint{Source: contract.SourceHTTP, URL: s.HTTP.URL, SecretRef: s.HTTP.SecretRef, CertConfigMap: s.HTTP.CertConfigMap,
			Checksum: s.HTTP.Checksum, ExtraHeaders: s.HTTP.ExtraHeaders, SecretExtraHeaders: s.HTTP.SecretExtraHeaders}, nil
	case s.S3 != nil:
		return ImportEndpoint{Source: contract.SourceS3, URL: s.S3.URL, SecretRef: s.S3.SecretRef, CertConfigMap: s.S3.CertConfigMap}, nil
	case s.Registry != nil:
		if s.Registry.URL == nil {
			return ImportEndpoint{}, fmt.Errorf("registry imports from an image stream are not supported; give registry.url (docker://... or oci-archive://...)")
		}
		if s.Registry.PullMethod != nil && *s.Registry.PullMethod == cdiv1.RegistryPullNode {
			return ImportEndpoint{}, fmt.Errorf("registry pullMethod node is not supported yet; use pod (the default)")
		}
		ep := ImportEndpoint{Source: contract.SourceRegistry, URL: *s.Registry.URL, SecretRef: ptr.Deref(s.Registry.SecretRef, ""), CertConfigMap: ptr.Deref(s.Registry.CertConfigMap, "")}
		if s.Registry.Platform != nil {
			ep.Architecture = s.Registry.Platform.Architecture
		}
		return ep, nil
	case s.Blank != nil:
		return ImportEndpoint{Source: contract.SourceNone}, nil
	case s.GCS != nil:
		return ImportEndpoint{}, fmt.Errorf("gcs sources are not supported yet; use an https URL to the object instead")
	case s.Imageio != nil:
		return ImportEndpoint{}, fmt.Errorf("imageio (oVirt) sources are not supported by Kubefill")
	case s.VDDK != nil:
		return ImportEndpoint{}, fmt.Errorf("vddk (VMware) sources are not supported by Kubefill")
	}
	return ImportEndpoint{}, fmt.Errorf("the VolumeImportSource names no source")
}

// PreparePrime records the import on the prime as CDI does.
func (k *ImportKind) PreparePrime(_ *corev1.PersistentVolumeClaim, source client.Object, prime *corev1.PersistentVolumeClaim) error {
	src := source.(*cdiv1.VolumeImportSource)
	ep, err := ResolveImportSource(src.Spec)
	if err != nil {
		return err
	}
	contentType := string(src.Spec.ContentType)
	if contentType == "" {
		contentType = string(cdiv1.DataVolumeKubeVirt)
	}
	if contentType == string(cdiv1.DataVolumeArchive) && ptr.Deref(prime.Spec.VolumeMode, "") == corev1.PersistentVolumeBlock {
		return fmt.Errorf("contentType archive needs a Filesystem volume; this claim is Block")
	}
	set := map[string]string{cdiv1.AnnSource: ep.Source, cdiv1.AnnEndpoint: ep.URL, cdiv1.AnnContentType: contentType}
	for key, v := range map[string]string{cdiv1.AnnSecret: ep.SecretRef, cdiv1.AnnCertConfigMap: ep.CertConfigMap, cdiv1.AnnChecksum: ep.Checksum} {
		if v != "" {
			set[key] = v
		}
	}
	if src.Spec.Preallocation != nil {
		set[cdiv1.AnnPreallocationRequested] = strconv.FormatBool(*src.Spec.Preallocation)
	}
	for key, v := range set {
		prime.Annotations[key] = v
	}
	return nil
}

// PodName implements Worker: CDI's importer pod name.
func (k *ImportKind) PodName(prime *corev1.PersistentVolumeClaim) string {
	return cdiv1.ImporterPodName(prime.Name)
}

func (k *ImportKind) metricsPort() int32 {
	if k.MetricsPort != 0 {
		return k.MetricsPort
	}
	return contract.MetricsPort
}

// WorkerSpec implements Worker: the importer's container, its environment
// (the worker contract), and the CA and secret-header volumes it names.
func (k *ImportKind) WorkerSpec(ctx context.Context, f *Flow, config *cdiv1.CDIConfig) (WorkerSpec, error) {
	ep, err := ResolveImportSource(f.Source.(*cdiv1.VolumeImportSource).Spec)
	if err != nil {
		return WorkerSpec{}, err
	}
	prime := f.Prime
	size := prime.Spec.Resources.Requests[corev1.ResourceStorage]
	env := []corev1.EnvVar{
		{Name: contract.EnvSource, Value: ep.Source},
		{Name: contract.EnvEndpoint, Value: ep.URL},
		{Name: contract.EnvContentType, Value: prime.Annotations[cdiv1.AnnContentType]},
		{Name: contract.EnvImageSize, Value: size.String()},
		{Name: contract.EnvOwnerUID, Value: string(f.Target.UID)},
		{Name: contract.EnvFilesystemOverhead, Value: FilesystemOverhead(config, ptr.Deref(prime.Spec.StorageClassName, ""))},
		{Name: contract.EnvPreallocation, Value: strconv.FormatBool(prime.Annotations[cdiv1.AnnPreallocationRequested] == "true" || config.Status.Preallocation)},
	}
	if ep.Checksum != "" {
		env = append(env, corev1.EnvVar{Name: contract.EnvChecksum, Value: ep.Checksum})
	}
	if ep.Architecture != "" {
		env = append(env, corev1.EnvVar{Name: contract.EnvRegistryArchitecture, Value: ep.Architecture})
	}
	for i, h := range ep.ExtraHeaders {
		env = append(env, corev1.EnvVar{Name: contract.EnvExtraHeaderPrefix + strconv.Itoa(i), Value: h})
	}
	// CDIConfig's import proxy may carry credentials in its URLs: the
	// importer reads it from the worker's Secret, not from its pod's spec,
	// which anyone who may view the namespace reads.
	secret := importProxySecret(config.Status.ImportProxy)
	for _, e := range importProxyEnv {
		if _, ok := secret[e]; ok {
			env = append(env, SecretEnv(k.PodName(prime), e, e))
		}
	}
	if InsecureRegistry(ep.URL, config) {
		env = append(env, corev1.EnvVar{Name: contract.EnvInsecureTLS, Value: "true"})
	}
	var proxyCA []byte
	if ep.Source != contract.SourceNone {
		// A blank image reaches nothing, as in CDI.
		if proxyCA, err = k.proxyCA(ctx, config); err != nil {
			return WorkerSpec{}, err
		}
	}
	if proxyCA != nil {
		if secret == nil {
			secret = map[string][]byte{}
		}
		secret[proxyCAKey] = proxyCA
	}
	if ep.SecretRef != "" {
		for name, key := range map[string]string{contract.EnvAccessKeyID: "accessKeyId", contract.EnvSecretKey: "secretKey"} {
			env = append(env, corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: ep.SecretRef}, Key: key, Optional: ptr.To(true)}}})
		}
	}
	port := k.metricsPort()
	scratch := &ScratchInput{Worker: ScratchImporter, Source: ep.Source, ContentType: prime.Annotations[cdiv1.AnnContentType],
		Annotations: []map[string]string{f.Target.Annotations, prime.Annotations}}
	spec := WorkerSpec{Component: "importer", Noun: "importer pod", SecretData: secret, Scratch: scratch, Container: corev1.Container{
		Name:    "importer",
		Command: []string{"kubefill", "importer"},
		Args:    []string{"--metrics-addr", fmt.Sprintf(":%d", port)},
		Ports:   []corev1.ContainerPort{{Name: "metrics", ContainerPort: port, Protocol: corev1.ProtocolTCP}},
	}}
	c := &spec.Container
	if ep.CertConfigMap != "" {
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: contract.CertVolumeName, VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: ep.CertConfigMap}}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: contract.CertVolumeName, MountPath: contract.CertDir, ReadOnly: true})
		env = append(env, corev1.EnvVar{Name: contract.EnvCertDir, Value: contract.CertDir})
	}
	if proxyCA != nil {
		// The ConfigMap is the install namespace's; the pod reads the
		// copy in its worker Secret, which goes with it.
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: contract.ProxyCertVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: WorkerSecretName(k.PodName(prime)), Items: []corev1.KeyToPath{{Key: proxyCAKey, Path: "ca.crt"}}}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: contract.ProxyCertVolume, MountPath: contract.ProxyCertDir, ReadOnly: true})
		env = append(env, corev1.EnvVar{Name: contract.EnvProxyCertDir, Value: contract.ProxyCertDir})
	}
	for i, secret := range ep.SecretExtraHeaders {
		name := fmt.Sprintf("cdi-secret-extra-headers-vol-%d", i)
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: fmt.Sprintf("%s/secret-%d", contract.SecretHeadersDir, i), ReadOnly: true})
	}
	if len(ep.SecretExtraHeaders) > 0 {
		env = append(env, corev1.EnvVar{Name: contract.EnvSecretExtraHeadersDir, Value: contract.SecretHeadersDir})
	}
	c.Env = env
	return spec, nil
}

// proxyCAKey is the worker Secret's key of the import proxy's CA bundle.
const proxyCAKey = "proxy-ca.crt"

// proxyCA reads the CA bundle of CDIConfig's importProxy.trustedCAProxy
// ConfigMap in the install namespace; nil when CDIConfig names none.
func (k *ImportKind) proxyCA(ctx context.Context, config *cdiv1.CDIConfig) ([]byte, error) {
	name := TrustedCAProxy(config)
	if name == "" {
		return nil, nil
	}
	if k.Namespace == "" {
		return nil, fmt.Errorf("CDIConfig importProxy.trustedCAProxy names ConfigMap %s, but the controller does not know its install namespace (set POD_NAMESPACE)", name)
	}
	r := k.Reader
	if r == nil {
		r = k.Client
	}
	cm := &corev1.ConfigMap{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: k.Namespace, Name: name}, cm); err != nil {
		return nil, fmt.Errorf("reading the import proxy's CA ConfigMap %s/%s (CDIConfig importProxy.trustedCAProxy): %w", k.Namespace, name, err)
	}
	bundle := ProxyCABundle(cm)
	if len(bundle) == 0 {
		return nil, fmt.Errorf("the import proxy's CA ConfigMap %s/%s (CDIConfig importProxy.trustedCAProxy) is empty; put the CA certificates (PEM) under ca.crt", k.Namespace, name)
	}
	return bundle, nil
}

// importProxyEnv are the importer's proxy variables, in order; each is also
// its key in the worker's Secret.
var importProxyEnv = []string{contract.EnvHTTPProxy, contract.EnvHTTPSProxy, contract.EnvNoProxy}

// importProxySecret is the worker Secret's data for CDIConfig's import
// proxy: each value that is set, under its variable's name; nil when none
// is. Pure.
func importProxySecret(p *cdiv1.ImportProxy) map[string][]byte {
	if p == nil {
		return nil
	}
	var out map[string][]byte
	for i, v := range []*string{p.HTTPProxy, p.HTTPSProxy, p.NoProxy} {
		if v == nil || *v == "" {
			continue
		}
		if out == nil {
			out = map[string][]byte{}
		}
		out[importProxyEnv[i]] = []byte(*v)
	}
	return out
}

// Observe implements Worker: a running importer's progress, read every 2 s.
func (k *ImportKind) Observe(ctx context.Context, f *Flow, pod *corev1.Pod, res *Result) error {
	if res.Pod.Phase == corev1.PodSucceeded {
		return k.labelFromImage(ctx, f.Target, pod)
	}
	if res.Pod.Phase != corev1.PodRunning {
		return nil
	}
	scrape := k.ScrapeProgress
	if scrape == nil {
		scrape = func(ctx context.Context, pod *corev1.Pod, port int32) (float64, error) {
			return ScrapeProgress(ctx, pod, port, contract.ImportProgressMetric)
		}
	}
	if pct, err := scrape(ctx, pod, k.metricsPort()); err == nil {
		res.Progress = FormatProgress(pct, false)
	}
	res.RetryAfter = 2 * time.Second
	return nil
}

// labelFromImage gives the target the labels its image asked for in the
// importer's termination message (a containerdisk's instancetype and
// preference defaults), as CDI does; a DataSource of the claim then carries
// them too.
func (k *ImportKind) labelFromImage(ctx context.Context, target *corev1.PersistentVolumeClaim, pod *corev1.Pod) error {
	var asked map[string]string
	for _, cs := range pod.Status.ContainerStatuses {
		if term := cs.State.Terminated; term != nil {
			if msg, ok := contract.DecodeTermination(term.Message); ok {
				asked = msg.Labels
			}
		}
	}
	add := ImageLabelsForClaim(target.Labels, asked)
	if len(add) == 0 {
		return nil
	}
	patch := client.MergeFrom(target.DeepCopy())
	if target.Labels == nil {
		target.Labels = map[string]string{}
	}
	for key, v := range add {
		target.Labels[key] = v
	}
	if err := k.Client.Patch(ctx, target, patch); err != nil {
		return fmt.Errorf("labelling claim %s as its image asks: %w", target.Name, err)
	}
	return nil
}

// ImageLabelsForClaim are the labels of an image (read back from its
// importer, so untrusted) that a claim takes: only keys in the kubevirt.io
// domain or a subdomain of it, as CDI's conversion makes them, that are
// valid labels and that the claim does not have yet. Pure.
func ImageLabelsForClaim(claim, image map[string]string) map[string]string {
	out := map[string]string{}
	for key, v := range image {
		if _, has := claim[key]; has {
			continue
		}
		domain, _, ok := strings.Cut(key, "/")
		if !ok || (domain != "kubevirt.io" && !strings.HasSuffix(domain, ".kubevirt.io")) {
			continue
		}
		if len(validation.IsQualifiedName(key)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
			continue
		}
		out[key] = v
	}
	return out
}
