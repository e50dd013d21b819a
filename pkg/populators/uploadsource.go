package populators

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/importer"
	"github.com/kubefill/kubefill/pkg/uploadserver"
)

// Secrets and names the upload flow shares with the upload proxy. All the
// Secrets below live in the controller's install namespace, except the
// per-pod serving Secret, which sits next to its upload pod.
const (
	// UploadServerCASecret holds the CA (tls.crt, tls.key) that signs each
	// upload pod's serving certificate. The proxy trusts its tls.crt.
	UploadServerCASecret = "kubefill-upload-server-ca"
	// UploadProxyClientCASecret holds the CA (tls.crt, tls.key) of the
	// proxy's client certificates; upload servers accept only those.
	UploadProxyClientCASecret = "kubefill-uploadproxy-client-ca"
	// UploadProxyClientSecret is the proxy's client certificate: tls.crt and
	// tls.key (common name UploadProxyClientName), plus ca.crt, the upload
	// server CA to verify upload pods with.
	UploadProxyClientSecret = "kubefill-uploadproxy-client"
	// UploadProxyClientName is the common name upload servers require.
	UploadProxyClientName = "kubefill-uploadproxy"
	// UploadServerPort is the upload server's TLS port in the pod; its
	// Service listens on 443.
	UploadServerPort = 8443
	// LabelUploadTarget on an upload pod names its prime; the pod's Service
	// selects on it.
	LabelUploadTarget = "kubefill.io/upload-target"
	uploadTLSDir      = "/etc/kubefill/upload-tls"
	uploadTLSVolume   = "upload-tls"
	caValidity        = 10 * 365 * 24 * time.Hour
	leafValidity      = 365 * 24 * time.Hour
)

// UploadPodName is the upload pod's name for a prime; its Service and its
// serving-certificate Secret have the same name.
func UploadPodName(prime *corev1.PersistentVolumeClaim) string { return "cdi-upload-" + prime.Name }

// UploadServiceHost is the DNS name the proxy dials (and verifies) for an
// upload pod: <service>.<namespace>.svc.
func UploadServiceHost(serviceName, namespace string) string {
	return serviceName + "." + namespace + ".svc"
}

// UploadKind fills a prime with `kubefill uploadserver` in a pod that the
// upload proxy streams the user's image into.
type UploadKind struct {
	Client client.Client
	// Reader reads Secrets and Services without a cache; nil uses Client.
	Reader client.Reader
	// Namespace is the controller's install namespace, where the CAs live.
	Namespace string
	// Image is the container image holding the kubefill binary.
	Image      string
	PullPolicy corev1.PullPolicy
	// ScrapeProgress reads the upload server's progress; nil uses HTTPS to
	// the pod's upload port, where /metrics needs no client certificate.
	ScrapeProgress func(ctx context.Context, pod *corev1.Pod, port int32) (float64, error)
}

// Name implements Kind.
func (k *UploadKind) Name() string { return cdiv1.VolumeUploadSourceRef }

// GetSource implements Kind.
func (k *UploadKind) GetSource(ctx context.Context, key types.NamespacedName) (client.Object, error) {
	src := &cdiv1.VolumeUploadSource{}
	if err := k.Client.Get(ctx, key, src); err != nil {
		return nil, err
	}
	return src, nil
}

// PreparePrime implements Kind: the prime is marked as an upload target, as CDI does.
func (k *UploadKind) PreparePrime(_ *corev1.PersistentVolumeClaim, source client.Object, prime *corev1.PersistentVolumeClaim) error {
	src := source.(*cdiv1.VolumeUploadSource)
	prime.Annotations[cdiv1.AnnUploadRequest] = ""
	if ct := src.Spec.ContentType; ct != "" {
		prime.Annotations[cdiv1.AnnContentType] = string(ct)
	}
	if src.Spec.Preallocation != nil {
		prime.Annotations[cdiv1.AnnPreallocationRequested] = strconv.FormatBool(*src.Spec.Preallocation)
	}
	return nil
}

func (k *UploadKind) reader() client.Reader {
	if k.Reader != nil {
		return k.Reader
	}
	return k.Client
}

// Fill implements Kind: it makes sure the serving Secret, the Service and the
// upload pod exist, and reports the pod's state; Ready is the pod's readiness.
func (k *UploadKind) Fill(ctx context.Context, target, prime *corev1.PersistentVolumeClaim, _ client.Object) (WorkerState, error) {
	name := UploadPodName(prime)
	pod := &corev1.Pod{}
	err := k.Client.Get(ctx, types.NamespacedName{Namespace: prime.Namespace, Name: name}, pod)
	if err != nil && !apierrors.IsNotFound(err) {
		return WorkerState{}, fmt.Errorf("reading upload pod: %w", err)
	}
	restarts, _ := strconv.Atoi(prime.Annotations[annUploadRestarts])
	if err == nil {
		state := PodState(pod)
		state.Restarts += int32(restarts)
		if state.Phase == corev1.PodFailed && !state.Permanent {
			// The upload server stopped: an async upload that could not be
			// written after its client was answered, or a crash. (A bad upload
			// answered with a 4xx leaves the server up.) Start a fresh one and
			// count the restart.
			if err := patchAnnotations(ctx, k.Client, prime, map[string]string{annUploadRestarts: strconv.Itoa(restarts + 1)}); err != nil {
				return WorkerState{}, err
			}
			if err := k.Client.Delete(ctx, pod); client.IgnoreNotFound(err) != nil {
				return WorkerState{}, fmt.Errorf("deleting failed upload pod: %w", err)
			}
			state.Phase, state.Reason, state.Ready = corev1.PodPending, "Retrying", false
			state.Message = "the upload server stopped: " + state.Message + "; starting a new one"
			state.Restarts++
			state.RetryAfter = 5 * time.Second
			// The new server has received nothing: the upload starts over.
			state.Progress = FormatProgress(0, false)
		}
		switch {
		case state.Phase == corev1.PodRunning && state.Ready:
			pct, serr := k.scrape(ctx, pod)
			if serr != nil {
				log.FromContext(ctx).V(1).Info("reading upload progress", "pod", pod.Name, "error", serr.Error())
			}
			state.Progress, state.RetryAfter = UploadProgress(pct, serr)
		case state.Phase == corev1.PodRunning:
			state.RetryAfter = 5 * time.Second
		}
		// Clients that follow storage.populator.pvcPrime read readiness on the prime.
		if ready := strconv.FormatBool(state.Ready); prime.Annotations[cdiv1.AnnPodReady] != ready {
			if err := patchAnnotations(ctx, k.Client, prime, map[string]string{cdiv1.AnnPodReady: ready}); err != nil {
				return WorkerState{}, err
			}
		}
		return state, nil
	}
	if k.Namespace == "" {
		// Without it there is nowhere to keep the upload CAs: tell the user.
		return WorkerState{Reason: "UploadNotConfigured", RetryAfter: time.Minute,
			Message: "the Kubefill controller has no install namespace for the upload CAs; run it with POD_NAMESPACE set"}, nil
	}
	if err := k.ensureServing(ctx, target, prime); err != nil {
		return WorkerState{}, err
	}
	pod, err = k.newPod(ctx, target, prime)
	if err != nil {
		return WorkerState{}, err
	}
	if err := k.Client.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			return WorkerState{Reason: "ErrStartingPod", Message: "cannot start the upload pod: " + err.Error(), RetryAfter: 30 * time.Second}, nil
		}
		return WorkerState{}, fmt.Errorf("creating upload pod: %w", err)
	}
	return WorkerState{Phase: corev1.PodPending, Reason: "Pending", Restarts: int32(restarts), RetryAfter: 5 * time.Second}, nil
}

// scrape reads the upload server's progress metric from its pod.
func (k *UploadKind) scrape(ctx context.Context, pod *corev1.Pod) (float64, error) {
	if k.ScrapeProgress != nil {
		return k.ScrapeProgress(ctx, pod, UploadServerPort)
	}
	return ScrapeProgress(ctx, pod, UploadServerPort, importer.ProgressMetricName)
}

// annUploadRestarts on a prime counts the upload pods that stopped before
// the upload succeeded.
const annUploadRestarts = "kubefill.io/upload-restarts"

// Cleanup implements Kind: the pod, its Service and its Secret go; a
// retained pod is detached from the target instead.
func (k *UploadKind) Cleanup(ctx context.Context, prime *corev1.PersistentVolumeClaim, retain bool) error {
	name := UploadPodName(prime)
	key := types.NamespacedName{Namespace: prime.Namespace, Name: name}
	for _, obj := range []client.Object{&corev1.Service{}, &corev1.Secret{}} {
		obj.SetNamespace(key.Namespace)
		obj.SetName(key.Name)
		if err := k.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting %s %s: %w", fmt.Sprintf("%T", obj), name, err)
		}
	}
	pod := &corev1.Pod{}
	if err := k.Client.Get(ctx, key, pod); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !retain {
		return client.IgnoreNotFound(k.Client.Delete(ctx, pod))
	}
	patch := client.MergeFrom(pod.DeepCopy())
	pod.OwnerReferences = nil
	return k.Client.Patch(ctx, pod, patch)
}

// EnsureCA returns the CA kept in Secret name of the install namespace,
// creating it when absent. Concurrent creators converge on the first one.
func EnsureCA(ctx context.Context, c client.Client, r client.Reader, namespace, name string) (*uploadserver.CA, error) {
	key := types.NamespacedName{Namespace: namespace, Name: name}
	for range 3 {
		s := &corev1.Secret{}
		err := r.Get(ctx, key, s)
		if err == nil {
			ca, err := uploadserver.LoadCA(s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey])
			if err != nil {
				return nil, fmt.Errorf("Secret %s/%s: %w", namespace, name, err)
			}
			return ca, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("reading Secret %s/%s: %w", namespace, name, err)
		}
		ca, err := uploadserver.NewCA(name, caValidity)
		if err != nil {
			return nil, err
		}
		s = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: map[string]string{cdiv1.LabelAppManagedBy: "kubefill"}},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: ca.CertPEM, corev1.TLSPrivateKeyKey: ca.KeyPEM},
		}
		if err := c.Create(ctx, s); err == nil {
			return ca, nil
		} else if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating Secret %s/%s: %w", namespace, name, err)
		}
	}
	return nil, fmt.Errorf("Secret %s/%s keeps changing", namespace, name)
}

// EnsureUploadPKI makes sure the upload server CA, the proxy's client CA and
// the proxy's client certificate exist, and returns both CAs.
func EnsureUploadPKI(ctx context.Context, c client.Client, r client.Reader, namespace string) (serverCA, clientCA *uploadserver.CA, err error) {
	if namespace == "" {
		return nil, nil, fmt.Errorf("the controller's install namespace is not set (POD_NAMESPACE)")
	}
	if serverCA, err = EnsureCA(ctx, c, r, namespace, UploadServerCASecret); err != nil {
		return nil, nil, err
	}
	if clientCA, err = EnsureCA(ctx, c, r, namespace, UploadProxyClientCASecret); err != nil {
		return nil, nil, err
	}
	s := &corev1.Secret{}
	err = r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: UploadProxyClientSecret}, s)
	if err == nil && bytes.Equal(s.Data["ca.crt"], serverCA.CertPEM) {
		return serverCA, clientCA, nil
	}
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, nil, fmt.Errorf("reading Secret %s/%s: %w", namespace, UploadProxyClientSecret, err)
	}
	crt, key, ierr := clientCA.Issue(UploadProxyClientName, nil, true, leafValidity)
	if ierr != nil {
		return nil, nil, ierr
	}
	data := map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key, "ca.crt": serverCA.CertPEM}
	if apierrors.IsNotFound(err) {
		s = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: UploadProxyClientSecret, Namespace: namespace, Labels: map[string]string{cdiv1.LabelAppManagedBy: "kubefill"}},
			Type:       corev1.SecretTypeTLS, Data: data,
		}
		if err := c.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
			return nil, nil, fmt.Errorf("creating Secret %s/%s: %w", namespace, UploadProxyClientSecret, err)
		}
		return serverCA, clientCA, nil
	}
	s.Data = data
	if err := c.Update(ctx, s); err != nil {
		return nil, nil, fmt.Errorf("updating Secret %s/%s: %w", namespace, UploadProxyClientSecret, err)
	}
	return serverCA, clientCA, nil
}

// ensureServing creates the upload pod's serving Secret and its Service.
func (k *UploadKind) ensureServing(ctx context.Context, target, prime *corev1.PersistentVolumeClaim) error {
	name := UploadPodName(prime)
	owner := ownedByTarget(target)
	s := &corev1.Secret{}
	err := k.reader().Get(ctx, types.NamespacedName{Namespace: prime.Namespace, Name: name}, s)
	if apierrors.IsNotFound(err) {
		serverCA, clientCA, err := EnsureUploadPKI(ctx, k.Client, k.reader(), k.Namespace)
		if err != nil {
			return err
		}
		host := UploadServiceHost(name, prime.Namespace)
		crt, key, err := serverCA.Issue(host, []string{name, name + "." + prime.Namespace, host, host + ".cluster.local"}, false, leafValidity)
		if err != nil {
			return err
		}
		s = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: prime.Namespace, Labels: workerLabels(target), OwnerReferences: owner},
			Type:       corev1.SecretTypeTLS,
			Data:       map[string][]byte{corev1.TLSCertKey: crt, corev1.TLSPrivateKeyKey: key, "client-ca.crt": clientCA.CertPEM},
		}
		if err := k.Client.Create(ctx, s); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating upload Secret %s: %w", name, err)
		}
	} else if err != nil {
		return fmt.Errorf("reading upload Secret %s: %w", name, err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: prime.Namespace, Labels: workerLabels(target), OwnerReferences: owner},
		Spec: corev1.ServiceSpec{
			Selector: map[string]string{LabelUploadTarget: prime.Name},
			Ports: []corev1.ServicePort{{Name: "uploadserver", Protocol: corev1.ProtocolTCP, Port: 443,
				TargetPort: intstr.FromInt32(UploadServerPort)}},
		},
	}
	if err := k.Client.Create(ctx, svc); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating upload Service %s: %w", name, err)
	}
	return nil
}

func ownedByTarget(target *corev1.PersistentVolumeClaim) []metav1.OwnerReference {
	return []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "PersistentVolumeClaim", Name: target.Name, UID: target.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}
}

func workerLabels(target *corev1.PersistentVolumeClaim) map[string]string {
	return map[string]string{
		cdiv1.LabelApp:          cdiv1.LabelAppValue,
		cdiv1.LabelComponent:    "upload-server",
		cdiv1.LabelOwnedByUID:   string(target.UID),
		cdiv1.LabelAppComponent: "upload-server",
		cdiv1.LabelAppManagedBy: "kubefill",
	}
}

// newPod renders the upload pod for a prime.
func (k *UploadKind) newPod(ctx context.Context, target, prime *corev1.PersistentVolumeClaim) (*corev1.Pod, error) {
	config := &cdiv1.CDIConfig{}
	if err := k.Client.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, config); client.IgnoreNotFound(err) != nil {
		return nil, fmt.Errorf("reading CDIConfig: %w", err)
	}
	image := k.Image
	if image == "" {
		image = defaultImporterImage
	}
	name := UploadPodName(prime)
	size := prime.Spec.Resources.Requests[corev1.ResourceStorage]
	contentType := prime.Annotations[cdiv1.AnnContentType]
	if contentType == "" {
		contentType = string(cdiv1.DataVolumeKubeVirt)
	}
	args := []string{
		"--listen", fmt.Sprintf(":%d", UploadServerPort),
		"--tls-cert-file", uploadTLSDir + "/" + corev1.TLSCertKey,
		"--tls-key-file", uploadTLSDir + "/" + corev1.TLSPrivateKeyKey,
		"--client-ca-file", uploadTLSDir + "/client-ca.crt",
		"--client-name", UploadProxyClientName,
		"--content-type", contentType,
		"--image-size", size.String(),
		"--filesystem-overhead", FilesystemOverhead(config, ptr.Deref(prime.Spec.StorageClassName, "")),
		"--preallocation=" + strconv.FormatBool(prime.Annotations[cdiv1.AnnPreallocationRequested] == "true" || config.Status.Preallocation),
		"--owner-uid", string(target.UID),
	}
	probe := &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/healthz", Port: intstr.FromInt32(UploadServerPort), Scheme: corev1.URISchemeHTTPS}},
		PeriodSeconds: 2, FailureThreshold: 3,
	}
	container := corev1.Container{
		Name:                     "cdi-upload-server",
		Image:                    image,
		ImagePullPolicy:          k.PullPolicy,
		Command:                  []string{"kubefill", "uploadserver"},
		Args:                     args,
		Ports:                    []corev1.ContainerPort{{Name: "uploadserver", ContainerPort: UploadServerPort, Protocol: corev1.ProtocolTCP}},
		ReadinessProbe:           probe,
		TerminationMessagePath:   corev1.TerminationMessagePathDefault,
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
		VolumeMounts: []corev1.VolumeMount{
			{Name: scratchVolumeName, MountPath: importer.DefaultScratchDir},
			{Name: uploadTLSVolume, MountPath: uploadTLSDir, ReadOnly: true},
		},
	}
	if config.Status.DefaultPodResourceRequirements != nil {
		container.Resources = *config.Status.DefaultPodResourceRequirements.DeepCopy()
	}
	if prime.Spec.VolumeMode != nil && *prime.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		container.VolumeDevices = []corev1.VolumeDevice{{Name: dataVolumeName, DevicePath: importer.DefaultBlockPath}}
	} else {
		container.VolumeMounts = append(container.VolumeMounts, corev1.VolumeMount{Name: dataVolumeName, MountPath: dataMountDir})
	}
	labels := workerLabels(target)
	labels[LabelUploadTarget] = prime.Name
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: prime.Namespace,
			Labels:    labels,
			// The target owns the pod (see the import kind for why not the prime).
			Annotations:     map[string]string{annTargetName: target.Name},
			OwnerReferences: ownedByTarget(target),
		},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{container},
			Volumes: []corev1.Volume{
				{Name: dataVolumeName, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: prime.Name}}},
				// Scratch for qcow2 and the formats converted from a local file:
				// an upload stream cannot be read by ranges. Bounded by the claim's size.
				{Name: scratchVolumeName, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &size}}},
				{Name: uploadTLSVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: name}}},
			},
			RestartPolicy:     corev1.RestartPolicyNever,
			PriorityClassName: prime.Annotations[cdiv1.AnnPriorityClassName],
		},
	}, nil
}
