package populators

import (
	"context"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
)

// UploadKind fills a prime with `kubefill uploadserver` in a pod that the
// upload proxy streams the user's image into: prime → serving (the pod's
// certificate Secret and Service) → worker → rebind.
type UploadKind struct {
	Client client.Client
	// Reader reads Secrets without a cache; nil uses Client.
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

// UploadPodName is the upload pod's name for a prime (or a claim filled in
// place); its Service and its serving-certificate Secret are named
// UploadServiceName (the same name unless the claim's has dots or is long).
func UploadPodName(prime *corev1.PersistentVolumeClaim) string {
	return cdiv1.UploadPodName(prime.Name)
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

// Plan implements Kind.
func (k *UploadKind) Plan() []Phase {
	return []Phase{&PrimePhase{Prepare: k.PreparePrime}, k.serving(), k.worker(), &RebindPhase{}}
}

func (k *UploadKind) serving() *UploadServing {
	return &UploadServing{Client: k.Client, Reader: k.Reader, Namespace: k.Namespace}
}

// worker runs the upload server. One that stops (an async upload that could
// not be written after its client was answered, or a crash; a bad upload
// answered with a 4xx leaves it up) is replaced at once, as often as it
// stops: the user uploads again.
func (k *UploadKind) worker() *WorkerPhase {
	return UploadServerPhase(&UploadServer{Client: k.Client, ScrapeProgress: k.ScrapeProgress}, k.Image, k.PullPolicy)
}

// UploadServerPhase runs server on the prime, replaced at once as often as
// it stops.
func UploadServerPhase(server *UploadServer, image string, pullPolicy corev1.PullPolicy) *WorkerPhase {
	return &WorkerPhase{Client: server.Client, Worker: server, Image: image, PullPolicy: pullPolicy, Retry: RetryPolicy{
		MaxRetries: -1,
		RetryMessage: func(_ int, failure string, _ time.Duration) string {
			return "the upload server stopped: " + failure + "; starting a new one"
		},
	}}
}

// UploadServer is the `kubefill uploadserver` worker on a prime: the upload
// kind's, and a host-assisted clone's target side.
type UploadServer struct {
	Client client.Client
	// ScrapeProgress reads the upload server's progress; nil uses HTTPS to
	// the pod's upload port, where /metrics needs no client certificate.
	ScrapeProgress func(ctx context.Context, pod *corev1.Pod, port int32) (float64, error)
	// ClientName is the common name the server requires of its clients'
	// certificates, computed by the controller; nil is
	// UploadProxyClientName (the upload proxy's).
	ClientName func(f *Flow) (string, error)
	// NoProgress leaves the progress to another worker (a clone's source pod).
	NoProgress bool
	// NoScratch leaves out scratch space: a host-assisted clone's server
	// writes its stream as it comes, as CDI's clone target does.
	NoScratch bool
}

// PreparePrime marks the prime as an upload target, as CDI does.
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

// PodName implements Worker.
func (k *UploadKind) PodName(prime *corev1.PersistentVolumeClaim) string { return UploadPodName(prime) }

// WorkerSpec implements Worker (see UploadServer).
func (k *UploadKind) WorkerSpec(ctx context.Context, f *Flow, config *cdiv1.CDIConfig) (WorkerSpec, error) {
	return (&UploadServer{Client: k.Client}).WorkerSpec(ctx, f, config)
}

// Observe implements Worker (see UploadServer).
func (k *UploadKind) Observe(ctx context.Context, f *Flow, pod *corev1.Pod, res *Result) error {
	return (&UploadServer{Client: k.Client, ScrapeProgress: k.ScrapeProgress}).Observe(ctx, f, pod, res)
}

// PodName implements Worker.
func (u *UploadServer) PodName(prime *corev1.PersistentVolumeClaim) string {
	return UploadPodName(prime)
}

// WorkerSpec implements Worker: the upload server's container, serving
// mTLS with the certificate Secret the serving phase made.
func (u *UploadServer) WorkerSpec(_ context.Context, f *Flow, config *cdiv1.CDIConfig) (WorkerSpec, error) {
	clientName := UploadProxyClientName
	if u.ClientName != nil {
		var err error
		if clientName, err = u.ClientName(f); err != nil {
			return WorkerSpec{}, err
		}
	}
	prime := f.Prime
	size := prime.Spec.Resources.Requests[corev1.ResourceStorage]
	contentType := prime.Annotations[cdiv1.AnnContentType]
	if contentType == "" {
		contentType = string(cdiv1.DataVolumeKubeVirt)
	}
	tlsDir := contract.UploadTLSDir
	args := []string{
		"--listen", fmt.Sprintf(":%d", contract.UploadServerPort),
		"--tls-cert-file", tlsDir + "/" + corev1.TLSCertKey,
		"--tls-key-file", tlsDir + "/" + corev1.TLSPrivateKeyKey,
		"--client-ca-file", tlsDir + "/" + UploadClientCAKey,
		"--client-name", clientName,
		"--content-type", contentType,
		"--image-size", size.String(),
		"--filesystem-overhead", FilesystemOverhead(config, ptr.Deref(prime.Spec.StorageClassName, "")),
		"--preallocation=" + strconv.FormatBool(prime.Annotations[cdiv1.AnnPreallocationRequested] == "true" || config.Status.Preallocation),
		"--owner-uid", string(f.Target.UID),
	}
	var scratch *ScratchInput
	if !u.NoScratch {
		scratch = &ScratchInput{Worker: ScratchUploadServer, ContentType: contentType}
	}
	return WorkerSpec{
		Component: "upload-server",
		Noun:      "upload pod",
		Scratch:   scratch,
		Container: corev1.Container{
			Name:    "cdi-upload-server",
			Command: []string{"kubefill", "uploadserver"},
			Args:    args,
			Ports:   []corev1.ContainerPort{{Name: "uploadserver", ContainerPort: contract.UploadServerPort, Protocol: corev1.ProtocolTCP}},
			ReadinessProbe: &corev1.Probe{
				ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
					Path: "/healthz", Port: intstr.FromInt32(contract.UploadServerPort), Scheme: corev1.URISchemeHTTPS}},
				PeriodSeconds: 2, FailureThreshold: 3,
			},
			VolumeMounts: []corev1.VolumeMount{{Name: contract.UploadTLSVolume, MountPath: tlsDir, ReadOnly: true}},
		},
		Volumes: []corev1.Volume{{Name: contract.UploadTLSVolume, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: UploadServiceName(prime)}}}},
		Labels:  map[string]string{LabelUploadTarget: uploadTargetLabel(prime)},
	}, nil
}

// Observe implements Worker: a ready server's progress, and its readiness
// on the prime, where clients that follow storage.populator.pvcPrime read it.
func (u *UploadServer) Observe(ctx context.Context, f *Flow, pod *corev1.Pod, res *Result) error {
	switch {
	case u.NoProgress:
		if res.Pod.Phase == corev1.PodRunning {
			res.RetryAfter = 5 * time.Second
		}
	case res.Reason == ReasonRetrying:
		// The new server has received nothing: the upload starts over.
		res.Progress = FormatProgress(0, false)
	case res.Pod.Phase == corev1.PodRunning && res.Pod.Ready:
		scrape := u.ScrapeProgress
		if scrape == nil {
			scrape = func(ctx context.Context, pod *corev1.Pod, port int32) (float64, error) {
				return ScrapeProgress(ctx, pod, port, contract.ImportProgressMetric)
			}
		}
		pct, err := scrape(ctx, pod, contract.UploadServerPort)
		if err != nil {
			log.FromContext(ctx).V(1).Info("reading upload progress", "pod", pod.Name, "error", err.Error())
		}
		res.Progress, res.RetryAfter = UploadProgress(pct, err)
	case res.Pod.Phase == corev1.PodRunning:
		res.RetryAfter = 5 * time.Second
	}
	return patchAnnotations(ctx, u.Client, f.Prime, map[string]string{cdiv1.AnnPodReady: strconv.FormatBool(res.Pod.Ready)})
}

// How often a ready upload server's progress is read: often while data
// arrives, less often while it waits for an upload, which may take hours
// to start.
const (
	uploadBusyPoll = 2 * time.Second
	uploadIdlePoll = 5 * time.Second
)

// UploadProgress is what a target shows of a ready upload server's
// progress, the percentage of the upload's body received (of its
// Content-Length), and when to read it again. pct is the server's metric,
// err why it could not be read; then the target keeps what it shows ("").
// Before any byte arrives, or when the upload's length is unknown, that is
// "0.00%"; 100% only once the data is on the volume (see FormatProgress).
func UploadProgress(pct float64, err error) (progress string, retryAfter time.Duration) {
	switch {
	case err != nil:
		return "", uploadIdlePoll
	case pct <= 0:
		return FormatProgress(0, false), uploadIdlePoll
	}
	return FormatProgress(pct, false), uploadBusyPoll
}

// UploadServing makes the upload pod's serving certificate Secret, issued
// by the upload server CA for the pod's Service, and the Service the upload
// proxy (or a clone's source pod) dials.
type UploadServing struct {
	Client client.Client
	// Reader reads Secrets without a cache; nil uses Client.
	Reader client.Reader
	// Namespace is the controller's install namespace, where the CAs live.
	Namespace string
	// PublishNotReady makes the Service route to the upload pod as soon as
	// it has an address, before its readiness probe passes (a clone's
	// source pod, started beside it, retries until the server listens).
	PublishNotReady bool
	// CloneClients makes the server trust the clone client signer's
	// certificates instead of the upload proxy's: a host-assisted clone's
	// upload server, which only its source pod may reach.
	CloneClients bool
}

// Name implements Phase.
func (p *UploadServing) Name() string { return "serving" }

// Reconcile implements Phase: done once the Secret and the Service exist,
// or once the upload pod does (it is made only after them).
func (p *UploadServing) Reconcile(ctx context.Context, f *Flow) (Result, error) {
	if f.HandedOver() {
		return Result{Done: true}, nil
	}
	name := UploadPodName(f.Prime)
	err := p.Client.Get(ctx, types.NamespacedName{Namespace: f.Prime.Namespace, Name: name}, &corev1.Pod{})
	if err == nil {
		return Result{Done: true}, nil
	}
	if !apierrors.IsNotFound(err) {
		return Result{}, fmt.Errorf("reading upload pod %s: %w", name, err)
	}
	if p.Namespace == "" {
		// Without it there is nowhere to keep the upload CAs: tell the user.
		return Result{Reason: "UploadNotConfigured", RetryAfter: time.Minute,
			Message: "the Kubefill controller has no install namespace for the upload CAs; run it with POD_NAMESPACE set"}, nil
	}
	if err := p.ensureServing(ctx, f.Target, f.Prime); err != nil {
		return Result{}, err
	}
	return Result{Done: true}, nil
}

// Cleanup implements Cleaner: the Service and the Secret go.
func (p *UploadServing) Cleanup(ctx context.Context, f *Flow, _ bool) error {
	name := UploadServiceName(f.Prime)
	for _, obj := range []client.Object{&corev1.Service{}, &corev1.Secret{}} {
		obj.SetNamespace(f.Prime.Namespace)
		obj.SetName(name)
		if err := p.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting %T %s: %w", obj, name, err)
		}
	}
	return nil
}

func (p *UploadServing) reader() client.Reader {
	if p.Reader != nil {
		return p.Reader
	}
	return p.Client
}
