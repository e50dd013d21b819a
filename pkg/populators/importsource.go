package populators

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/importer"
)

// ImportKind fills a prime by running `kubefill importer` in a pod.
type ImportKind struct {
	Client client.Client
	// Image is the container image holding the kubefill binary.
	Image string
	// PullPolicy is the importer image's pull policy.
	PullPolicy corev1.PullPolicy
	// MetricsPort is where the importer serves its progress over TLS.
	MetricsPort int32
	// ScrapeProgress reads the importer's progress; nil uses HTTPS to the pod.
	ScrapeProgress func(ctx context.Context, pod *corev1.Pod, port int32) (float64, error)
	// MaxRetries bounds how often a failed, retryable import starts again.
	MaxRetries int32
	// Backoff is the wait before the first retry; it doubles each time.
	Backoff time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// The prime annotations the import kind keeps for itself.
const (
	annRetryNotBefore = "kubefill.io/retry-not-before"
	annAttempts       = "kubefill.io/attempts"
)

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
		return ImportEndpoint{Source: importer.SourceHTTP, URL: s.HTTP.URL, SecretRef: s.HTTP.SecretRef, CertConfigMap: s.HTTP.CertConfigMap,
			Checksum: s.HTTP.Checksum, ExtraHeaders: s.HTTP.ExtraHeaders, SecretExtraHeaders: s.HTTP.SecretExtraHeaders}, nil
	case s.S3 != nil:
		return ImportEndpoint{Source: importer.SourceS3, URL: s.S3.URL, SecretRef: s.S3.SecretRef, CertConfigMap: s.S3.CertConfigMap}, nil
	case s.Registry != nil:
		if s.Registry.URL == nil {
			return ImportEndpoint{}, fmt.Errorf("registry imports from an image stream are not supported; give registry.url (docker://... or oci-archive://...)")
		}
		if s.Registry.PullMethod != nil && *s.Registry.PullMethod == cdiv1.RegistryPullNode {
			return ImportEndpoint{}, fmt.Errorf("registry pullMethod node is not supported yet; use pod (the default)")
		}
		ep := ImportEndpoint{Source: importer.SourceRegistry, URL: *s.Registry.URL, SecretRef: ptr.Deref(s.Registry.SecretRef, ""), CertConfigMap: ptr.Deref(s.Registry.CertConfigMap, "")}
		if s.Registry.Platform != nil {
			ep.Architecture = s.Registry.Platform.Architecture
		}
		return ep, nil
	case s.Blank != nil:
		return ImportEndpoint{Source: importer.SourceNone}, nil
	case s.GCS != nil:
		return ImportEndpoint{}, fmt.Errorf("gcs sources are not supported yet; use an https URL to the object instead")
	case s.Imageio != nil:
		return ImportEndpoint{}, fmt.Errorf("imageio (oVirt) sources are not supported by Kubefill")
	case s.VDDK != nil:
		return ImportEndpoint{}, fmt.Errorf("vddk (VMware) sources are not supported by Kubefill")
	}
	return ImportEndpoint{}, fmt.Errorf("the VolumeImportSource names no source")
}

// PreparePrime implements Kind: it records the import on the prime as CDI does.
func (k *ImportKind) PreparePrime(target *corev1.PersistentVolumeClaim, source client.Object, prime *corev1.PersistentVolumeClaim) error {
	src := source.(*cdiv1.VolumeImportSource)
	ep, err := ResolveImportSource(src.Spec)
	if err != nil {
		return err
	}
	contentType := string(src.Spec.ContentType)
	if contentType == "" {
		contentType = string(cdiv1.DataVolumeKubeVirt)
	}
	if contentType == string(cdiv1.DataVolumeArchive) && prime.Spec.VolumeMode != nil && *prime.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		return fmt.Errorf("contentType archive needs a Filesystem volume; this claim is Block")
	}
	set := map[string]string{
		cdiv1.AnnSource:      ep.Source,
		cdiv1.AnnEndpoint:    ep.URL,
		cdiv1.AnnContentType: contentType,
	}
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

// importerPodName is the importer pod's name for a prime, as CDI names it.
func importerPodName(prime *corev1.PersistentVolumeClaim) string { return "importer-" + prime.Name }

// Fill implements Kind.
func (k *ImportKind) Fill(ctx context.Context, target, prime *corev1.PersistentVolumeClaim, source client.Object) (WorkerState, error) {
	c := k.Client
	attempts, _ := strconv.Atoi(prime.Annotations[annAttempts])
	restarts := int32(max(attempts-1, 0))
	pod := &corev1.Pod{}
	err := c.Get(ctx, types.NamespacedName{Namespace: prime.Namespace, Name: importerPodName(prime)}, pod)
	if apierrors.IsNotFound(err) {
		if nb, ok := prime.Annotations[annRetryNotBefore]; ok {
			if t, perr := time.Parse(time.RFC3339, nb); perr == nil && k.now().Before(t) {
				return WorkerState{Restarts: restarts, Reason: "Backoff", Message: "waiting before the next attempt", RetryAfter: t.Sub(k.now())}, nil
			}
		}
		pod, err = k.newPod(ctx, c, target, prime, source.(*cdiv1.VolumeImportSource))
		if err != nil {
			return WorkerState{}, err
		}
		if err := c.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
			if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
				// The user can fix these (quota, priority class, policy): tell them.
				return WorkerState{Restarts: restarts, Reason: "ErrStartingPod", Message: "cannot start the importer pod: " + err.Error(), RetryAfter: 30 * time.Second}, nil
			}
			return WorkerState{}, fmt.Errorf("creating importer pod: %w", err)
		}
		if err := patchAnnotations(ctx, c, prime, map[string]string{annAttempts: strconv.Itoa(attempts + 1)}); err != nil {
			return WorkerState{}, err
		}
		return WorkerState{Phase: corev1.PodPending, Restarts: restarts, Reason: "Pending", RetryAfter: 5 * time.Second}, nil
	}
	if err != nil {
		return WorkerState{}, fmt.Errorf("reading importer pod: %w", err)
	}
	state := PodState(pod)
	state.Restarts += restarts
	switch state.Phase {
	case corev1.PodRunning:
		if pct, err := k.scrape(ctx, pod); err == nil {
			state.Progress = FormatProgress(pct, false)
		}
		state.RetryAfter = 2 * time.Second
	case corev1.PodFailed:
		if !state.Permanent && int32(attempts) <= k.MaxRetries {
			backoff := k.Backoff << min(attempts-1, 6)
			if err := patchAnnotations(ctx, c, prime, map[string]string{annRetryNotBefore: k.now().Add(backoff).UTC().Format(time.RFC3339)}); err != nil {
				return WorkerState{}, err
			}
			if err := c.Delete(ctx, pod); client.IgnoreNotFound(err) != nil {
				return WorkerState{}, fmt.Errorf("deleting failed importer pod: %w", err)
			}
			// A failure that will be retried is not the import's end: say so.
			state.Phase, state.Reason = corev1.PodPending, "Retrying"
			state.Message = fmt.Sprintf("attempt %d failed: %s; retrying in %s", attempts, state.Message, backoff)
			state.Restarts++
			state.RetryAfter = backoff
		} else if !state.Permanent {
			state.Permanent = true
			state.Message = fmt.Sprintf("gave up after %d attempts: %s", attempts, state.Message)
		}
	}
	return state, nil
}

// Cleanup implements Kind: the importer pod is deleted, unless it is
// retained; then it is detached from the target so that it outlives it.
func (k *ImportKind) Cleanup(ctx context.Context, prime *corev1.PersistentVolumeClaim, retain bool) error {
	c := k.Client
	pod := &corev1.Pod{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: prime.Namespace, Name: importerPodName(prime)}, pod); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !retain {
		return client.IgnoreNotFound(c.Delete(ctx, pod))
	}
	patch := client.MergeFrom(pod.DeepCopy())
	pod.OwnerReferences = nil
	return c.Patch(ctx, pod, patch)
}

// terminationMessage is the part of the importer's termination message the
// controller reads.
type terminationMessage struct {
	Outcome   string  `json:"outcome"`
	Message   *string `json:"message"`
	Permanent *bool   `json:"permanent"`
}

// PodState reads a worker pod's state as a kubelet reports it. A pod that
// exits 0 without the importer's success marker has not succeeded.
func PodState(pod *corev1.Pod) WorkerState {
	s := WorkerState{Phase: pod.Status.Phase}
	for _, cond := range pod.Status.Conditions {
		switch {
		case cond.Type == corev1.PodReady:
			s.Ready = cond.Status == corev1.ConditionTrue
		case cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse:
			s.Reason, s.Message = cond.Reason, cond.Message
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		s.Restarts += cs.RestartCount
		switch {
		case cs.State.Waiting != nil && cs.State.Waiting.Reason != "":
			s.Reason, s.Message = cs.State.Waiting.Reason, cs.State.Waiting.Message
		case cs.State.Running != nil:
			s.Reason = cdiv1.ReasonTransferRunning
		case cs.State.Terminated != nil:
			term := cs.State.Terminated
			var msg terminationMessage
			parsed := json.Unmarshal([]byte(term.Message), &msg) == nil && msg.Outcome != ""
			if parsed && msg.Message != nil {
				s.Message = *msg.Message
			} else {
				s.Message = strings.TrimSpace(term.Message)
			}
			switch {
			case term.ExitCode == 0 && parsed && msg.Outcome == importer.OutcomeSucceeded:
				s.Phase, s.Reason = corev1.PodSucceeded, cdiv1.ReasonCompleted
			case term.ExitCode == 0:
				s.Phase, s.Reason = corev1.PodFailed, cdiv1.ReasonError
				s.Message = "the importer exited without reporting success; its data is not trusted"
			default:
				s.Phase, s.Reason = corev1.PodFailed, cdiv1.ReasonError
				s.Permanent = msg.Permanent != nil && *msg.Permanent
				if s.Message == "" {
					s.Message = fmt.Sprintf("the importer exited with code %d (%s)", term.ExitCode, term.Reason)
				}
			}
		}
	}
	return s
}

func (k *ImportKind) now() time.Time {
	if k.Now != nil {
		return k.Now()
	}
	return time.Now()
}

// scrape reads the importer's progress metric from its pod.
func (k *ImportKind) scrape(ctx context.Context, pod *corev1.Pod) (float64, error) {
	if k.ScrapeProgress != nil {
		return k.ScrapeProgress(ctx, pod, k.MetricsPort)
	}
	return ScrapeProgress(ctx, pod, k.MetricsPort, importer.ProgressMetricName)
}

// ScrapeProgress reads metric{ownerUID=<the pod's owner>}, a percentage,
// from a worker pod's TLS /metrics endpoint on port: the importer's metrics
// server or the upload server. Neither asks for a client certificate there.
// The serving certificate is not verified (the importer's is self-signed,
// the upload server's names its Service, not the pod IP dialled): only a
// percentage is read.
func ScrapeProgress(ctx context.Context, pod *corev1.Pod, port int32, metric string) (float64, error) {
	if pod.Status.PodIP == "" {
		return 0, fmt.Errorf("pod %s has no IP yet", pod.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	url := "https://" + net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(int(port))) + "/metrics"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, fmt.Errorf("scraping %s: %w", url, err)
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // only a number is read
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, fmt.Errorf("scraping %s: %w", url, err)
	}
	return ParseProgressMetric(string(body), metric, pod.Labels[cdiv1.LabelOwnedByUID])
}

// ParseProgressMetric finds metric{ownerUID="uid"} in a Prometheus text
// exposition and returns its value, a percentage.
func ParseProgressMetric(text, metric, ownerUID string) (float64, error) {
	for _, line := range strings.Split(text, "\n") {
		end := strings.LastIndex(line, "}")
		if !strings.HasPrefix(line, metric+"{") || end < 0 || !strings.Contains(line[:end], `ownerUID="`+ownerUID+`"`) {
			continue
		}
		// The value follows the labels; an optional timestamp may follow it.
		fields := strings.Fields(line[end+1:])
		if len(fields) == 0 {
			return 0, fmt.Errorf("parsing %q: no value", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return 0, fmt.Errorf("parsing %q: %w", line, err)
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, fmt.Errorf("parsing %q: not a percentage", line)
		}
		return v, nil
	}
	return 0, fmt.Errorf("metric %s for owner %s not found", metric, ownerUID)
}

// patchAnnotations merges ann into obj's annotations.
func patchAnnotations(ctx context.Context, c client.Client, obj client.Object, ann map[string]string) error {
	patch := client.MergeFrom(obj.DeepCopyObject().(client.Object))
	merged := obj.GetAnnotations()
	if merged == nil {
		merged = map[string]string{}
	}
	for k, v := range ann {
		merged[k] = v
	}
	obj.SetAnnotations(merged)
	if err := c.Patch(ctx, obj, patch); err != nil {
		return fmt.Errorf("annotating %s: %w", obj.GetName(), err)
	}
	return nil
}

// The importer pod's mounts.
const (
	certMountDir         = "/certs"
	secretHeadersDir     = "/extraheaders"
	dataVolumeName       = "cdi-data-vol"
	scratchVolumeName    = "cdi-scratch-vol"
	dataMountDir         = "/data"
	defaultImporterImage = "kubefill/kubefill:dev"
)

// newPod renders the importer pod for a prime.
func (k *ImportKind) newPod(ctx context.Context, c client.Client, target, prime *corev1.PersistentVolumeClaim, src *cdiv1.VolumeImportSource) (*corev1.Pod, error) {
	ep, err := ResolveImportSource(src.Spec)
	if err != nil {
		return nil, err
	}
	config := &cdiv1.CDIConfig{}
	if err := c.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, config); client.IgnoreNotFound(err) != nil {
		return nil, fmt.Errorf("reading CDIConfig: %w", err)
	}
	image := k.Image
	if image == "" {
		image = defaultImporterImage
	}
	size := prime.Spec.Resources.Requests[corev1.ResourceStorage]
	env := []corev1.EnvVar{
		{Name: importer.EnvSource, Value: ep.Source},
		{Name: importer.EnvEndpoint, Value: ep.URL},
		{Name: importer.EnvContentType, Value: prime.Annotations[cdiv1.AnnContentType]},
		{Name: importer.EnvImageSize, Value: size.String()},
		{Name: importer.EnvOwnerUID, Value: string(target.UID)},
		{Name: importer.EnvFilesystemOverhead, Value: FilesystemOverhead(config, ptr.Deref(prime.Spec.StorageClassName, ""))},
		{Name: importer.EnvPreallocation, Value: strconv.FormatBool(prime.Annotations[cdiv1.AnnPreallocationRequested] == "true" || config.Status.Preallocation)},
	}
	if ep.Checksum != "" {
		env = append(env, corev1.EnvVar{Name: importer.EnvChecksum, Value: ep.Checksum})
	}
	if ep.Architecture != "" {
		env = append(env, corev1.EnvVar{Name: importer.EnvRegistryArchitecture, Value: ep.Architecture})
	}
	for i, h := range ep.ExtraHeaders {
		env = append(env, corev1.EnvVar{Name: importer.EnvExtraHeaderPrefix + strconv.Itoa(i), Value: h})
	}
	if p := config.Status.ImportProxy; p != nil {
		for name, v := range map[string]*string{importer.EnvHTTPProxy: p.HTTPProxy, importer.EnvHTTPSProxy: p.HTTPSProxy, importer.EnvNoProxy: p.NoProxy} {
			if v != nil && *v != "" {
				env = append(env, corev1.EnvVar{Name: name, Value: *v})
			}
		}
	}
	if ep.SecretRef != "" {
		for name, key := range map[string]string{importer.EnvAccessKeyID: "accessKeyId", importer.EnvSecretKey: "secretKey"} {
			env = append(env, corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: ep.SecretRef}, Key: key, Optional: ptr.To(true)}}})
		}
	}
	container := corev1.Container{
		Name:                     "importer",
		Image:                    image,
		ImagePullPolicy:          k.PullPolicy,
		Command:                  []string{"kubefill", "importer"},
		Args:                     []string{"--metrics-addr", fmt.Sprintf(":%d", k.MetricsPort)},
		Env:                      env,
		Ports:                    []corev1.ContainerPort{{Name: "metrics", ContainerPort: k.MetricsPort, Protocol: corev1.ProtocolTCP}},
		TerminationMessagePath:   corev1.TerminationMessagePathDefault,
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	}
	if config.Status.DefaultPodResourceRequirements != nil {
		container.Resources = *config.Status.DefaultPodResourceRequirements.DeepCopy()
	}
	volumes := []corev1.Volume{{Name: dataVolumeName, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: prime.Name}}}}
	if prime.Spec.VolumeMode != nil && *prime.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		container.VolumeDevices = []corev1.VolumeDevice{{Name: dataVolumeName, DevicePath: importer.DefaultBlockPath}}
	} else {
		container.VolumeMounts = []corev1.VolumeMount{{Name: dataVolumeName, MountPath: dataMountDir}}
	}
	// Scratch space for the formats qemu-img converts from a local file
	// (vmdk, vdi, vhd, vhdx, registry layers); bounded by the claim's size.
	volumes = append(volumes, corev1.Volume{Name: scratchVolumeName, VolumeSource: corev1.VolumeSource{
		EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &size}}})
	container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: scratchVolumeName, MountPath: importer.DefaultScratchDir})
	if ep.CertConfigMap != "" {
		volumes = append(volumes, corev1.Volume{Name: "cdi-cert-vol", VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: ep.CertConfigMap}}}})
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: "cdi-cert-vol", MountPath: certMountDir, ReadOnly: true})
		container.Env = append(container.Env, corev1.EnvVar{Name: importer.EnvCertDir, Value: certMountDir})
	}
	for i, secret := range ep.SecretExtraHeaders {
		name := fmt.Sprintf("cdi-secret-extra-headers-vol-%d", i)
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret}}})
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: name, MountPath: fmt.Sprintf("%s/secret-%d", secretHeadersDir, i), ReadOnly: true})
	}
	if len(ep.SecretExtraHeaders) > 0 {
		container.Env = append(container.Env, corev1.EnvVar{Name: importer.EnvSecretExtraHeadersDir, Value: secretHeadersDir})
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      importerPodName(prime),
			Namespace: prime.Namespace,
			Labels: map[string]string{
				cdiv1.LabelApp:          cdiv1.LabelAppValue,
				cdiv1.LabelComponent:    "importer",
				cdiv1.LabelOwnedByUID:   string(target.UID),
				cdiv1.LabelAppComponent: "importer",
				cdiv1.LabelAppManagedBy: "kubefill",
			},
			Annotations: map[string]string{annTargetName: target.Name},
			// The target owns the pod, not the prime: the prime's pvc-protection
			// finalizer waits for the pod, and a pod owned by the prime would wait
			// for the prime, so deleting the target would never finish.
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "PersistentVolumeClaim", Name: target.Name, UID: target.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: corev1.PodSpec{
			Containers:        []corev1.Container{container},
			Volumes:           volumes,
			RestartPolicy:     corev1.RestartPolicyNever,
			PriorityClassName: prime.Annotations[cdiv1.AnnPriorityClassName],
		},
	}
	return pod, nil
}

// FilesystemOverhead is the overhead in force for a StorageClass, as a
// string for the importer's environment.
func FilesystemOverhead(config *cdiv1.CDIConfig, storageClass string) string {
	if fo := config.Status.FilesystemOverhead; fo != nil {
		if v, ok := fo.StorageClass[storageClass]; ok && v != "" {
			return string(v)
		}
		if fo.Global != "" {
			return string(fo.Global)
		}
	}
	return string(cdiv1.DefaultFilesystemOverhead)
}
