package clone

import (
	"bytes"
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"path"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/certs"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/populators"
)

// hostClonePhase is the host-assisted copy (CDI's HostClone): an upload
// server on the prime, the upload kind's serving and worker, then a source
// pod that reads the source claim read-only and streams it to that server
// with a client certificate naming this clone. Done once the upload server
// has written everything and succeeded.
type hostClonePhase struct {
	run     *run
	serving *populators.UploadServing
	upload  *populators.WorkerPhase
	source  *populators.WorkerPhase
}

func newHostClonePhase(r *run) *hostClonePhase {
	k := r.k
	// The upload server takes only this clone's source pod: a certificate
	// of the clone client signer (CloneClients) with the clone's name,
	// computed here from the target and its VolumeCloneSource, never read
	// back from the prime (which may sit in a namespace its users edit).
	server := &populators.UploadServer{Client: k.Client, NoProgress: true, NoScratch: true, ClientName: cloneClientName}
	upload := populators.UploadServerPhase(server, k.Image, k.PullPolicy)
	upload.StateKey = "upload"
	return &hostClonePhase{
		run:     r,
		serving: &populators.UploadServing{Client: k.Client, Reader: k.Reader, Namespace: k.Namespace, PublishNotReady: true, CloneClients: true},
		upload:  upload,
		source: &populators.WorkerPhase{Client: k.Client, Worker: &sourceWorker{run: r}, Image: k.Image, PullPolicy: k.PullPolicy,
			StateKey: "source", Retry: populators.WorkerRetry},
	}
}

func (p *hostClonePhase) Name() string { return string(PhaseHostClone) }

func (p *hostClonePhase) Reconcile(ctx context.Context, f *populators.Flow) (populators.Result, error) {
	if !p.run.has(PhaseHostClone) || f.HandedOver() {
		return populators.Result{Done: true}, nil
	}
	if _, err := cloneClientName(f); err != nil {
		return populators.Result{}, err
	}
	if res, err := p.serving.Reconcile(ctx, f); err != nil || !res.Done {
		return res, err
	}
	up, err := p.upload.Reconcile(ctx, f)
	if err != nil || up.Done {
		return up, err
	}
	uploadPod, err := p.uploadPod(ctx, f, up)
	if err != nil {
		return populators.Result{}, err
	}
	if done, err := p.uploadSucceeded(ctx, f, up, uploadPod); err != nil || done != nil {
		return derefResult(done), err
	}
	// The source pod starts as soon as the upload pod exists: the two pods
	// start side by side. The source pod dials the upload Service, whose
	// address exists before the upload pod does and which publishes the
	// pod as soon as it has an address (sourceWorker.uploadURL); the
	// cloner retries a refused dial while the server comes up. A pod start
	// and a probe period less per clone. Once the upload pod has an
	// address the source pod is told it (tellSourceAddress), so the stream
	// need not wait for the node's Service proxy to route to the new pod;
	// and the upload server's own report of success ends the phase
	// (uploadSucceeded) before the kubelet notices the pod's exit.
	if up.Pod == nil || (up.Pod.Phase != corev1.PodPending && up.Pod.Phase != corev1.PodRunning) || up.Reason == reasonWorkerRetrying || up.Reason == reasonWorkerBackoff {
		if up.Reason == "" {
			up.Reason, up.Message = "Pending", "waiting for the clone's upload server to start"
		}
		return up, nil
	}
	if res, err := p.run.sourceFree(ctx); err != nil || res != nil {
		if res != nil {
			res.Pod = up.Pod
		}
		return derefResult(res), err
	}
	src, err := p.source.Reconcile(ctx, f)
	if err != nil {
		return src, err
	}
	if src.Pod != nil && (src.Pod.Phase == corev1.PodPending || src.Pod.Phase == corev1.PodRunning) && src.Reason != reasonWorkerRetrying {
		if err := p.tellSourceAddress(ctx, f, uploadPod); err != nil {
			return populators.Result{}, err
		}
	}
	if src.Pod != nil && src.Pod.Phase == corev1.PodSucceeded {
		// Everything was sent: the upload server finishes writing.
		up.Progress = populators.FormatProgress(100, false)
		return up, nil
	}
	src.Done = false
	var lastFailure string
	switch src.Reason {
	case reasonWorkerRetrying:
		// Kept on the prime: the next reconcile may read a target from the
		// cache that does not show this failure yet.
		if err := populators.PatchAnnotations(ctx, p.run.k.Client, f.Prime, map[string]string{annSourceFailure: src.Message}); err != nil {
			return populators.Result{}, fmt.Errorf("recording the source pod's failure on %s/%s: %w", f.Prime.Namespace, f.Prime.Name, err)
		}
	case reasonWorkerBackoff:
		if lastFailure, err = p.lastFailure(ctx, f.Prime); err != nil {
			return populators.Result{}, err
		}
	}
	return betweenAttempts(src, lastFailure), nil
}

// uploadSucceeded is the done result of a running upload pod whose server
// reported that the clone succeeded, the data fsynced (uploadOutcomes):
// what the pod's termination message will say once the kubelet reports its
// exit. Until then (nil) the pod's server is watched.
func (p *hostClonePhase) uploadSucceeded(ctx context.Context, f *populators.Flow, up populators.Result, pod *corev1.Pod) (*populators.Result, error) {
	if pod == nil || up.Pod.Phase != corev1.PodRunning {
		return nil, nil
	}
	k := p.run.k
	outcomes := k.uploadOutcomesOf()
	if m := outcomes.succeeded(pod.UID); m != nil {
		res := populators.Result{Done: true, Reason: cdiv1.ReasonCompleted, Progress: populators.FormatProgress(100, false),
			Pod: &populators.PodStatus{Phase: corev1.PodSucceeded, Restarts: up.Pod.Restarts}}
		if m.Message != nil {
			res.Message = *m.Message
		}
		log.FromContext(ctx).V(1).Info("the upload server reported the clone complete", "pod", pod.Name)
		return &res, nil
	}
	if pod.Status.PodIP == "" || !outcomes.started() || outcomes.watching(pod.UID) {
		return nil, nil
	}
	reader := k.Reader
	if reader == nil {
		reader = k.Client
	}
	u, err := populators.LoadUploadPKI(ctx, k.Client, reader, k.Namespace)
	if err != nil {
		return nil, err
	}
	return nil, outcomes.watch(f.Target, pod, UploadServerName(populators.UploadServiceName(f.Prime), f.Prime.Namespace), u.ServerBundle)
}

// uploadPod is the upload pod the worker phase reported (from the cache),
// nil while there is none.
func (p *hostClonePhase) uploadPod(ctx context.Context, f *populators.Flow, up populators.Result) (*corev1.Pod, error) {
	if up.Pod == nil || up.Pod.Phase == "" {
		return nil, nil
	}
	pod := &corev1.Pod{}
	key := types.NamespacedName{Namespace: f.Prime.Namespace, Name: cdiv1.UploadPodName(f.Prime.Name)}
	if err := p.run.k.Client.Get(ctx, key, pod); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil // just made: the cache has not seen it yet
		}
		return nil, fmt.Errorf("reading upload pod %s: %w", key.Name, err)
	}
	return pod, nil
}

// annUploadAddress on a clone source pod is its upload pod's own address,
// "<ip>:<port>", which the pod sees as contract.CloneUploadAddressFile
// through a downward API volume: the cloner dials it rather than wait for
// the Service proxy to route the Service's address to the new pod.
const annUploadAddress = "kubefill.io/upload-address"

// tellSourceAddress writes the upload pod's address on the running source
// pod once the upload pod has one (again if it was replaced).
func (p *hostClonePhase) tellSourceAddress(ctx context.Context, f *populators.Flow, uploadPod *corev1.Pod) error {
	if uploadPod == nil || uploadPod.Status.PodIP == "" || uploadPod.DeletionTimestamp != nil {
		return nil
	}
	addr := net.JoinHostPort(uploadPod.Status.PodIP, strconv.Itoa(contract.UploadServerPort))
	pod := &corev1.Pod{}
	key := types.NamespacedName{Namespace: f.Prime.Namespace, Name: SourcePodName(f.Target.UID)}
	if err := p.run.k.Client.Get(ctx, key, pod); err != nil {
		return client.IgnoreNotFound(err)
	}
	if pod.Annotations[annUploadAddress] == addr || pod.DeletionTimestamp != nil {
		return nil
	}
	patch := client.MergeFrom(pod.DeepCopy())
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[annUploadAddress] = addr
	if err := p.run.k.Client.Patch(ctx, pod, patch); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("telling source pod %s the upload pod's address: %w", pod.Name, err)
	}
	return nil
}

// annSourceFailure on a host-assisted clone's prime is the last failure of
// its source pod, shown while the next one is held off.
const annSourceFailure = "kubefill.io/clone-source-failure"

// lastFailure reads the prime's last source pod failure uncached: it was
// written moments ago, by the reconcile that removed the failed pod.
func (p *hostClonePhase) lastFailure(ctx context.Context, prime *corev1.PersistentVolumeClaim) (string, error) {
	reader := p.run.k.Reader
	if reader == nil {
		reader = p.run.k.Client
	}
	fresh := &corev1.PersistentVolumeClaim{}
	if err := reader.Get(ctx, client.ObjectKeyFromObject(prime), fresh); err != nil {
		return "", fmt.Errorf("reading prime %s/%s: %w", prime.Namespace, prime.Name, err)
	}
	return fresh.Annotations[annSourceFailure], nil
}

// The base worker's reasons for a failed worker pod that will run again,
// and for the wait before the next one starts.
const (
	reasonWorkerRetrying = "Retrying"
	reasonWorkerBackoff  = "Backoff"
)

// betweenAttempts keeps a failed source pod visible until the next one
// runs: the failure is a Warning event, and while the next attempt is held
// off the target keeps the failure's message ("attempt 1 failed: …;
// retrying in 10s", lastFailure) instead of a bare "waiting". Pure.
func betweenAttempts(res populators.Result, lastFailure string) populators.Result {
	switch res.Reason {
	case reasonWorkerRetrying:
		res.Event = corev1.EventTypeWarning
	case reasonWorkerBackoff:
		if lastFailure != "" {
			res.Reason, res.Message = reasonWorkerRetrying, lastFailure
		}
	}
	return res
}

// Cleanup implements populators.Cleaner: the pods, the Service and the
// Secrets go (the pods stay, detached, when retained). It runs for every
// clone, whatever its strategy: what a clone did not make is not found.
func (p *hostClonePhase) Cleanup(ctx context.Context, f *populators.Flow, retain bool) error {
	p.run.k.uploadOutcomesOf().forget(f.Target.UID)
	for _, c := range []populators.Cleaner{p.source, p.upload, p.serving} {
		if err := c.Cleanup(ctx, f, retain); err != nil {
			return err
		}
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.Prime.Namespace, Name: SourcePodName(f.Target.UID)}}
	return client.IgnoreNotFound(p.run.k.Client.Delete(ctx, secret))
}

func derefResult(r *populators.Result) populators.Result {
	if r == nil {
		return populators.Result{}
	}
	return *r
}

// sourceFree waits while the source claim is unbound or a pod has it
// mounted writable (its data would change under the copy); nil once free.
func (r *run) sourceFree(ctx context.Context) (*populators.Result, error) {
	src := r.source
	if src == nil {
		return nil, nil
	}
	if src.Status.Phase != corev1.ClaimBound {
		res := wait("CloneSourceNotReady", fmt.Sprintf("waiting for the source claim %s/%s to be bound (it is %s)", src.Namespace, src.Name, phaseOr(src.Status.Phase)), 5*time.Second)
		return &res, nil
	}
	pods := &corev1.PodList{}
	if err := r.k.Client.List(ctx, pods, client.InNamespace(src.Namespace)); err != nil {
		return nil, fmt.Errorf("listing the pods of namespace %s: %w", src.Namespace, err)
	}
	if pod := PodUsingClaim(pods.Items, src.Name); pod != "" {
		res := wait("CloneSourceInUse", fmt.Sprintf("pod %s using PersistentVolumeClaim %s; the clone waits until no pod mounts it writable (stop the pod, or its VM)", pod, src.Name), 5*time.Second)
		return &res, nil
	}
	return nil, nil
}

func phaseOr(p corev1.PersistentVolumeClaimPhase) string {
	if p == "" {
		return "Pending"
	}
	return string(p)
}

// sourceWorker is the clone source pod: `kubefill cloner` reading the
// source claim, mounted read-only.
type sourceWorker struct{ run *run }

// PodName implements populators.Worker: CDI's <target UID>-source-pod,
// with the UID taken from the prime's name (tmp-pvc-<UID>, which the
// controller chose and nobody can change), not from a label the users of
// the source's namespace may edit.
func (w *sourceWorker) PodName(prime *corev1.PersistentVolumeClaim) string {
	return SourcePodName(TargetOfTmpClaim(prime.Name))
}

// WorkerSpec implements populators.Worker: the cloner's container and
// environment, its client certificate, and the source as its data volume.
func (w *sourceWorker) WorkerSpec(ctx context.Context, f *populators.Flow, config *cdiv1.CDIConfig) (populators.WorkerSpec, error) {
	src := w.run.source
	if src == nil {
		return populators.WorkerSpec{}, fmt.Errorf("the clone's source claim was not read")
	}
	name := w.PodName(f.Prime)
	if err := w.ensureClientCert(ctx, f, name); err != nil {
		return populators.WorkerSpec{}, err
	}
	uploadName := populators.UploadServiceName(f.Prime)
	uploadURL, err := w.uploadURL(ctx, f.Prime.Namespace, uploadName)
	if err != nil {
		return populators.WorkerSpec{}, err
	}
	block := volumeMode(src.Spec.VolumeMode) == corev1.PersistentVolumeBlock
	mount := sourceMountPoint
	if block {
		mount = contract.BlockPath
	}
	prealloc := f.Prime.Annotations[cdiv1.AnnPreallocationRequested] == "true" || config.Status.Preallocation
	fromSecret := func(env, key string) corev1.EnvVar {
		return corev1.EnvVar{Name: env, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key}}}
	}
	return populators.WorkerSpec{
		Component: componentCloneSource,
		Noun:      "clone source pod",
		Container: corev1.Container{
			Name:    "cdi-clone-source",
			Command: []string{"kubefill", "cloner"},
			Ports:   []corev1.ContainerPort{{Name: "metrics", ContainerPort: contract.MetricsPort, Protocol: corev1.ProtocolTCP}},
			Env: []corev1.EnvVar{
				{Name: envVolumeMode, Value: volumeModeEnv(src)},
				{Name: envMountPoint, Value: mount},
				{Name: envUploadURL, Value: uploadURL},
				{Name: envUploadServerName, Value: UploadServerName(uploadName, f.Prime.Namespace)},
				{Name: contract.EnvCloneUploadAddressFile, Value: contract.CloneUploadAddressFile},
				{Name: envOwnerUID, Value: string(f.Target.UID)},
				{Name: envPreallocation, Value: strconv.FormatBool(prealloc)},
				fromSecret(envServerCACert, cloneServerCAKey),
				fromSecret(envClientCert, corev1.TLSCertKey),
				fromSecret(envClientKey, corev1.TLSPrivateKeyKey),
			},
			VolumeMounts: []corev1.VolumeMount{{Name: uploadAddressVolume, MountPath: contract.CloneUploadAddressDir, ReadOnly: true}},
		},
		Volumes: []corev1.Volume{{Name: uploadAddressVolume, VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{
			Items: []corev1.DownwardAPIVolumeFile{{Path: path.Base(contract.CloneUploadAddressFile),
				FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.annotations['" + annUploadAddress + "']"}}},
		}}}},
		Data: &populators.DataClaim{Name: src.Name, Block: block, MountPath: sourceMountPoint, ReadOnly: true},
	}, nil
}

// uploadAddressVolume shows the source pod its annUploadAddress.
const uploadAddressVolume = "upload-address"

// uploadURL is where the source pod sends the stream: the upload
// Service's cluster IP, which exists as soon as the Service does (before the
// upload pod), so both pods start at once; the certificate is checked
// against the Service's name (UploadServerName), no cluster DNS is needed.
// The Service publishes its pod once the pod has an address rather than
// once its readiness probe passed (UploadServing.PublishNotReady): the
// cloner retries a refused dial until the server listens, and a replaced
// upload pod is reached at the same address. Read uncached: the Service was
// made moments ago, in this reconcile or the last.
func (w *sourceWorker) uploadURL(ctx context.Context, namespace, name string) (string, error) {
	k := w.run.k
	reader := k.Reader
	if reader == nil {
		reader = k.Client
	}
	svc := &corev1.Service{}
	if err := reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, svc); err != nil {
		return "", fmt.Errorf("reading the clone's upload Service %s/%s: %w", namespace, name, err)
	}
	ip := svc.Spec.ClusterIP
	if ip == "" || ip == corev1.ClusterIPNone {
		return "", fmt.Errorf("the clone's upload Service %s/%s has no cluster IP", namespace, name)
	}
	return UploadURL(ip), nil
}

// ensureClientCert keeps the source pod's client certificate Secret, named
// after the pod, next to the prime: a certificate of the clone client
// signer whose common name is the clone's (cloneClientName), short-lived,
// issued again whenever it is not that, plus the upload-server signer's
// bundle (ca.crt) to verify the upload server with. The pod reads it once,
// when it starts (its environment), so a certificate issued again reaches
// the next source pod; the one running keeps its own, which it only needs
// for the TLS handshake.
func (w *sourceWorker) ensureClientCert(ctx context.Context, f *populators.Flow, name string) error {
	k := w.run.k
	reader := k.Reader
	if reader == nil {
		reader = k.Client
	}
	cn, err := cloneClientName(f)
	if err != nil {
		return err
	}
	key := types.NamespacedName{Namespace: f.Prime.Namespace, Name: name}
	existing := &corev1.Secret{}
	if err := reader.Get(ctx, key, existing); apierrors.IsNotFound(err) {
		existing = nil
	} else if err != nil {
		return fmt.Errorf("reading Secret %s: %w", key, err)
	}
	u, err := populators.LoadUploadPKI(ctx, k.Client, reader, k.Namespace)
	if err != nil {
		return err
	}
	now := time.Now()
	var have *x509.Certificate
	if existing != nil {
		have = certs.ParseLeaf(existing.Data[corev1.TLSCertKey], existing.Data[corev1.TLSPrivateKeyKey])
	}
	d := certs.DecideCloneClient(now, have, cn, certs.ParseBundle(u.CloneBundle))
	if !d.Renew && bytes.Equal(existing.Data[cloneServerCAKey], u.ServerBundle) {
		return nil
	}
	data := map[string][]byte{cloneServerCAKey: u.ServerBundle}
	if d.Renew {
		crt, pem, err := certs.IssueCloneClient(u.CloneSigner, cn, now)
		if err != nil {
			return fmt.Errorf("issuing the clone's client certificate: %w", err)
		}
		data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey] = crt, pem
		log.FromContext(ctx).V(1).Info("issued the clone source pod's client certificate", "secret", key.String(), "reason", d.Reason)
	} else {
		data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey] = existing.Data[corev1.TLSCertKey], existing.Data[corev1.TLSPrivateKeyKey]
	}
	if existing != nil {
		existing = existing.DeepCopy()
		existing.Data = data
		if err := k.Client.Update(ctx, existing); err != nil {
			return fmt.Errorf("updating Secret %s: %w", key, err)
		}
		return nil
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: f.Prime.Namespace, Labels: map[string]string{
			cdiv1.LabelApp: cdiv1.LabelAppValue, cdiv1.LabelOwnedByUID: string(f.Target.UID), cdiv1.LabelAppManagedBy: "kubefill"},
			Annotations: map[string]string{populators.TargetAnnotation: populators.TargetRef(f.Target.Namespace, f.Target.Name, f.Prime.Namespace)}},
		Type: corev1.SecretTypeTLS,
		Data: data,
	}
	if f.Prime.Namespace == f.Target.Namespace {
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "PersistentVolumeClaim", Name: f.Target.Name, UID: f.Target.UID}}
	}
	if err := k.Client.Create(ctx, s); err != nil {
		// Made meanwhile: the next source pod's reconcile checks it again.
		return fmt.Errorf("creating Secret %s: %w", key, err)
	}
	return nil
}

// cloneServerCAKey in the source pod's Secret is the upload-server signer's
// bundle, which the cloner verifies the clone's upload server with.
const cloneServerCAKey = "ca.crt"

// cloneClientName is the common name of the clone's client certificate and
// the one its upload server requires (UploadClientName): the source the
// VolumeCloneSource names, in its namespace, and the prime the controller
// names after the target (tmp-pvc-<target UID>, next to the source). It is
// computed on every use from those, never read from the prime.
func cloneClientName(f *populators.Flow) (string, error) {
	vcs, ok := f.Source.(*cdiv1.VolumeCloneSource)
	if !ok || vcs == nil {
		return "", fmt.Errorf("the clone's VolumeCloneSource was not read")
	}
	return UploadClientName(vcs.Namespace, vcs.Spec.Source.Name, populators.SourceNamespace(f.Target), TmpClaimName(f.Target.UID)), nil
}

// Observe implements populators.Worker: a running source pod's progress,
// the share of the source sent, never 100% before the target has it.
func (w *sourceWorker) Observe(ctx context.Context, _ *populators.Flow, pod *corev1.Pod, res *populators.Result) error {
	if res.Pod.Phase != corev1.PodRunning {
		return nil
	}
	scrape := w.run.k.ScrapeProgress
	if scrape == nil {
		scrape = func(ctx context.Context, pod *corev1.Pod, port int32) (float64, error) {
			return populators.ScrapeProgress(ctx, pod, port, contract.CloneProgressMetric)
		}
	}
	if pct, err := scrape(ctx, pod, contract.MetricsPort); err == nil {
		res.Progress = populators.FormatProgress(pct, false)
	} else {
		log.FromContext(ctx).V(1).Info("reading clone progress", "pod", pod.Name, "error", err.Error())
	}
	res.RetryAfter = 2 * time.Second
	return nil
}
