package populators

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
)

// Worker is a kind's part of its worker pod: the container and what to read
// from it. Everything else about the pod is the WorkerPhase's.
type Worker interface {
	// PodName names the worker pod of a prime (CDI's names).
	PodName(prime *corev1.PersistentVolumeClaim) string
	// WorkerSpec renders the kind's container and extra volumes for the
	// flow's prime, with the cluster's CDIConfig (never nil).
	WorkerSpec(ctx context.Context, f *Flow, config *cdiv1.CDIConfig) (WorkerSpec, error)
	// Observe adds what only the kind knows to an existing pod's result:
	// progress, when to look again, readiness to record. res has the retry
	// decision applied (a replaced pod shows Pending, Reason "Retrying").
	Observe(ctx context.Context, f *Flow, pod *corev1.Pod, res *Result) error
}

// WorkerSpec is what a kind puts in its worker pod.
type WorkerSpec struct {
	// Component is the pod's app.kubernetes.io/component and cdi.kubevirt.io
	// label value ("importer", "upload-server").
	Component string
	// Noun names the pod in messages ("importer pod").
	Noun string
	// Container has the kind's name, command, args, env, ports, probes and
	// mounts of its extra volumes. Image, pull policy, resources, the
	// termination message and the data and scratch volumes are added.
	Container corev1.Container
	// Volumes are the kind's extra volumes (certificates, TLS).
	Volumes []corev1.Volume
	// Labels are added to the pod's (a Service may select on them).
	Labels map[string]string
	// Data is the claim mounted as the data volume; nil mounts the prime,
	// writable, at /data or /dev/cdi-block-volume.
	Data *DataClaim
	// Scratch is what decides the worker's scratch space (see
	// DecideScratch); nil for a worker that never spools an image. The
	// WorkerPhase makes the scratch claim before the pod and mounts it
	// at contract.ScratchDir.
	Scratch *ScratchInput
	// SecretData are values the pod's spec must not show (credentials, such
	// as CDIConfig's import proxy URLs): the WorkerPhase writes them into
	// the Secret WorkerSecretName, in the pod's namespace, owned by the
	// target, before it makes the pod, and deletes it with the pod. The
	// container reads them through secretKeyRef (SecretEnv).
	SecretData map[string][]byte

	// scratchClaim is the scratch claim the phase made for this pod.
	scratchClaim string
}

// WorkerSecretName is the Secret of a worker pod's SecretData:
// <pod>-env (shortened as CDI's names are).
func WorkerSecretName(podName string) string { return cdiv1.ResourceName(podName, "env") }

// SecretEnv is the environment variable env of worker pod podName, read
// from key of its SecretData.
func SecretEnv(podName, env, key string) corev1.EnvVar {
	return corev1.EnvVar{Name: env, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: WorkerSecretName(podName)}, Key: key}}}
}

// DataClaim is a claim other than the prime that a worker mounts as its data
// volume: a clone source pod reads the source claim.
type DataClaim struct {
	Name string
	// Block mounts it as a device at contract.BlockPath, else as a
	// filesystem at MountPath.
	Block     bool
	MountPath string
	ReadOnly  bool
}

// ReasonRetrying is a replaced worker's reason: it failed and a new one
// starts; ReasonBackoff the wait before the new one.
const (
	ReasonRetrying = "Retrying"
	ReasonBackoff  = "Backoff"
)

// backoffMessage is what the target shows while the next worker waits: the
// failure it retries (an OOM kill, a dropped source) stays in view for the
// whole backoff, not only for the moment the failed pod was replaced.
func backoffMessage(target *corev1.PersistentVolumeClaim, waiting string) string {
	switch target.Annotations[cdiv1.AnnRunningConditionReason] {
	case ReasonRetrying, ReasonBackoff:
		if last := target.Annotations[cdiv1.AnnRunningConditionMessage]; last != "" {
			return last
		}
	}
	return waiting
}

// WorkerPhase runs a kind's worker pod on the prime until it succeeds, and
// starts it again after a retryable failure as its RetryPolicy says. The
// importer pod, the upload pod and the clone source pod are all run by it.
type WorkerPhase struct {
	Client client.Client
	Worker Worker
	// Image is the container image holding the kubefill binary; empty is
	// contract.DefaultImage.
	Image string
	// PullPolicy is the image's pull policy unless the CDI resource's
	// spec.imagePullPolicy says otherwise.
	PullPolicy corev1.PullPolicy
	Retry      RetryPolicy
	// StateKey tells apart the attempts of several workers on one prime (a
	// host-assisted clone's upload server and source pod); "" for the one worker.
	StateKey string
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Name implements Phase.
func (w *WorkerPhase) Name() string { return "worker" }

// Reconcile implements Phase: it reads the worker pod and starts, replaces
// or leaves it; the result always carries the pod's status.
func (w *WorkerPhase) Reconcile(ctx context.Context, f *Flow) (Result, error) {
	if f.HandedOver() {
		return Result{Done: true}, nil // the data has moved on; never start a worker again
	}
	prime := f.Prime
	st := parsePrimeStateFor(prime.Annotations, w.StateKey)
	name := w.Worker.PodName(prime)
	pod := &corev1.Pod{}
	err := w.Client.Get(ctx, types.NamespacedName{Namespace: prime.Namespace, Name: name}, pod)
	if err != nil && !apierrors.IsNotFound(err) {
		return Result{}, fmt.Errorf("reading worker pod %s: %w", name, err)
	}
	if err == nil {
		return w.observe(ctx, f, pod, st)
	}

	// No pod: start one unless the last one's backoff is still running.
	failedSoFar := int32(st.Attempts)
	if d := decideRetry(w.Retry, st, nil, w.now()); d.Action == holdOff {
		return Result{Pod: &PodStatus{Restarts: failedSoFar}, Reason: ReasonBackoff, Message: backoffMessage(f.Target, d.Message), RetryAfter: d.Wait}, nil
	}
	config := &cdiv1.CDIConfig{}
	if err := w.Client.Get(ctx, types.NamespacedName{Name: cdiv1.CDIConfigName}, config); client.IgnoreNotFound(err) != nil {
		return Result{}, fmt.Errorf("reading CDIConfig: %w", err)
	}
	// Read for each new pod, as CDIConfig is: a changed spec.workload
	// reaches the next pod.
	placement, err := ReadWorkloadPlacement(ctx, w.Client)
	if err != nil {
		return Result{}, err
	}
	pull, err := ReadWorkerPullPolicy(ctx, w.Client, w.PullPolicy)
	if err != nil {
		return Result{}, err
	}
	spec, err := w.Worker.WorkerSpec(ctx, f, config)
	if err != nil {
		return Result{}, err
	}
	restarts := int32(max(st.Attempts-1, 0))
	scratch, wait, err := w.ensureScratch(ctx, f, spec, config, st.Attempts+1)
	if err != nil {
		return Result{}, err
	}
	if wait != nil {
		wait.Pod = &PodStatus{Restarts: restarts}
		return *wait, nil
	}
	if scratch != nil {
		spec.scratchClaim = scratch.Name
	}
	if err := w.writeSecret(ctx, f, name, spec); err != nil {
		return Result{}, err
	}
	pod = w.render(f, name, spec, config, placement, pull)
	lost := workerLost(st)
	if err := w.Client.Create(ctx, pod); err != nil && !apierrors.IsAlreadyExists(err) {
		if q, ok := ParseQuotaExceeded(err); ok {
			// A pod quota (count/pods, requests.memory) in the worker's
			// namespace: say which, and go on once it has room.
			return Result{Pod: &PodStatus{Restarts: restarts}, Reason: ReasonExceededQuota, Event: corev1.EventTypeWarning, RetryAfter: QuotaRetry,
				Message: q.explainPod(spec.Noun, pod, f.Target)}, nil
		}
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			// The user can fix these (quota, priority class, policy): tell them.
			return Result{Pod: &PodStatus{Restarts: restarts}, Reason: "ErrStartingPod", Event: corev1.EventTypeWarning,
				Message: "cannot start the " + spec.Noun + ": " + err.Error(), RetryAfter: 30 * time.Second}, nil
		}
		return Result{}, fmt.Errorf("creating %s: %w", spec.Noun, err)
	}
	st.Attempts++
	st.RetryNotBefore = time.Time{}
	if err := savePrimeStateFor(ctx, w.Client, prime, w.StateKey, st); err != nil {
		return Result{}, err
	}
	res := Result{Pod: &PodStatus{Phase: corev1.PodPending, Restarts: int32(st.Attempts - 1)}, Reason: "Pending", RetryAfter: 5 * time.Second}
	if lost {
		// Deleted or evicted before it finished, and gone before a reconcile
		// saw it fail: the new attempt is a retry the user is told of.
		res.Reason, res.Event = ReasonRetrying, corev1.EventTypeWarning
		res.Message = fmt.Sprintf("the %s of attempt %d is gone before it finished (deleted or evicted); retrying with attempt %d", spec.Noun, st.Attempts-1, st.Attempts)
	} else if scratch != nil && scratch.Status.Phase != corev1.ClaimBound {
		res.Reason, res.Message = ReasonCreatingScratch, scratchPendingMessage(spec.Noun, scratch)
	}
	return res, nil
}

// workerLost reports whether a worker pod was started before and is gone
// without this phase having replaced it (replacing one records when the
// next may start).
func workerLost(st primeState) bool {
	return st.Attempts > 0 && st.RetryNotBefore.IsZero()
}

// observe reads an existing worker pod, replaces it when it failed and may
// run again, and lets the kind add progress.
func (w *WorkerPhase) observe(ctx context.Context, f *Flow, pod *corev1.Pod, st primeState) (Result, error) {
	res := PodState(pod)
	res.Pod.Restarts += int32(max(st.Attempts-1, 0))
	if res.Pod.Phase == corev1.PodFailed && ReportsScratchRequired(pod) && podScratchClaim(pod) == "" {
		return w.restartWithScratch(ctx, f, pod, st, res)
	}
	if res.Pod.Phase == corev1.PodPending {
		if err := w.explainScratchPending(ctx, f, pod, &res); err != nil {
			return Result{}, err
		}
	}
	if res.Pod.Phase == corev1.PodFailed {
		d := decideRetry(w.Retry, st, &workerFailure{Message: res.Message, Permanent: res.Permanent}, w.now())
		switch d.Action {
		case retryWorker:
			// Saved even with no wait: a retry-not-before time tells the next
			// pod's start that this phase replaced the pod (see workerLost).
			st.RetryNotBefore = w.now().Add(d.Wait)
			if err := savePrimeStateFor(ctx, w.Client, f.Prime, w.StateKey, st); err != nil {
				return Result{}, err
			}
			if err := w.Client.Delete(ctx, pod); client.IgnoreNotFound(err) != nil {
				return Result{}, fmt.Errorf("deleting failed worker pod %s: %w", pod.Name, err)
			}
			// The next attempt gets a fresh claim; none is held meanwhile.
			if err := w.deleteScratch(ctx, f); err != nil {
				return Result{}, err
			}
			// A failure that will be retried is not the population's end: say so.
			res.Pod.Phase, res.Pod.Ready, res.Reason, res.Message = corev1.PodPending, false, ReasonRetrying, d.Message
			res.Pod.Restarts++
			res.RetryAfter = d.Wait
			if d.Wait == 0 {
				res.RetryAfter = 5 * time.Second
			}
		case giveUp:
			res.Permanent, res.Message = true, d.Message
			// The failed pod stays for the user to read; its scratch
			// claim holds nothing worth keeping.
			if err := w.deleteScratch(ctx, f); err != nil {
				return Result{}, err
			}
		}
	}
	if err := w.Worker.Observe(ctx, f, pod, &res); err != nil {
		return Result{}, err
	}
	return res, nil
}

// render builds the worker pod: the kind's container with the image, the
// CDIConfig's resources and pull secrets, the prime as a block device or a
// filesystem at /data, the scratch claim when there is one, the shared
// labels, the prime's network and mesh annotations, the target as owner,
// the priority class, the CDI resource's placement, and no restarts (the
// phase decides retries).
func (w *WorkerPhase) render(f *Flow, name string, spec WorkerSpec, config *cdiv1.CDIConfig, placement cdiv1.NodePlacement, pull corev1.PullPolicy) *corev1.Pod {
	target, prime := f.Target, f.Prime
	c := spec.Container
	c.Image = w.Image
	if c.Image == "" {
		c.Image = contract.DefaultImage
	}
	c.ImagePullPolicy = pull
	c.TerminationMessagePath = corev1.TerminationMessagePathDefault
	c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
	// What Pod Security's "restricted" profile asks: workers need no
	// privilege, only the volumes, which fsGroup (Filesystem) and the
	// runtime's device ownership from runAsUser (Block) make theirs.
	c.SecurityContext = &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}
	if config.Status.DefaultPodResourceRequirements != nil {
		c.Resources = *config.Status.DefaultPodResourceRequirements.DeepCopy()
	}
	data := DataClaim{Name: prime.Name, Block: ptr.Deref(prime.Spec.VolumeMode, "") == corev1.PersistentVolumeBlock, MountPath: contract.DataDir}
	if spec.Data != nil {
		data = *spec.Data
	}
	mounts := []corev1.VolumeMount{}
	if data.Block {
		c.VolumeDevices = append([]corev1.VolumeDevice{{Name: contract.DataVolumeName, DevicePath: contract.BlockPath}}, c.VolumeDevices...)
	} else {
		mounts = append(mounts, corev1.VolumeMount{Name: contract.DataVolumeName, MountPath: data.MountPath, ReadOnly: data.ReadOnly})
	}
	volumes := []corev1.Volume{{Name: contract.DataVolumeName, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: data.Name, ReadOnly: data.ReadOnly}}}}
	if spec.scratchClaim != "" {
		mounts = append(mounts, corev1.VolumeMount{Name: contract.ScratchVolumeName, MountPath: contract.ScratchDir})
		volumes = append(volumes, corev1.Volume{Name: contract.ScratchVolumeName, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: spec.scratchClaim}}})
	}
	c.VolumeMounts = append(mounts, c.VolumeMounts...)
	volumes = append(volumes, spec.Volumes...)
	labels := workerLabels(target, spec.Component)
	labels[cdiv1.LabelAllowAccessClusterServices] = "true"
	for k, v := range spec.Labels {
		labels[k] = v
	}
	annotations := WorkerPodAnnotations(prime.Annotations)
	annotations[annTargetName] = targetRef(target.Namespace, target.Name, prime.Namespace)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   prime.Namespace,
			Labels:      labels,
			Annotations: annotations,
			// The target owns the pod, not the prime: the prime's pvc-protection
			// finalizer waits for the pod, and a pod owned by the prime would wait
			// for the prime, so deleting the target would never finish.
			OwnerReferences: ownedBy(target, prime.Namespace),
		},
		Spec: corev1.PodSpec{
			Containers:    []corev1.Container{c},
			Volumes:       volumes,
			RestartPolicy: corev1.RestartPolicyNever,
			// Workers talk to no API server: no ServiceAccount token is
			// mounted (a parser bug reached through an image would otherwise
			// hold the namespace's default token).
			AutomountServiceAccountToken: ptr.To(false),
			SecurityContext:              workerPodSecurity(),
			PriorityClassName:            prime.Annotations[cdiv1.AnnPriorityClassName],
			ImagePullSecrets:             workerPullSecrets(config),
			NodeSelector:                 placement.NodeSelector,
			Affinity:                     placement.Affinity,
			Tolerations:                  placement.Tolerations,
		},
	}
}

// writeSecret writes spec's SecretData into the worker's Secret, made or
// replaced as a whole (a CDIConfig edited since the last attempt reaches
// the next pod), or deletes the Secret when there is none (an earlier
// attempt's values do not linger). Secrets are not cached: it never reads
// one.
func (w *WorkerPhase) writeSecret(ctx context.Context, f *Flow, podName string, spec WorkerSpec) error {
	if len(spec.SecretData) == 0 {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: WorkerSecretName(podName), Namespace: f.Prime.Namespace}}
		if err := w.Client.Delete(ctx, s); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting the %s's Secret %s/%s: %w", spec.Noun, s.Namespace, s.Name, err)
		}
		return nil
	}
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: WorkerSecretName(podName), Namespace: f.Prime.Namespace,
			Labels: workerLabels(f.Target, spec.Component), OwnerReferences: ownedBy(f.Target, f.Prime.Namespace),
			Annotations: map[string]string{annTargetName: targetRef(f.Target.Namespace, f.Target.Name, f.Prime.Namespace)}},
		Type: corev1.SecretTypeOpaque,
		Data: spec.SecretData,
	}
	err := w.Client.Create(ctx, s)
	if apierrors.IsAlreadyExists(err) {
		// An earlier attempt's: made again as a whole (the controller may
		// create and delete Secrets, not patch them), before the pod that
		// reads it exists.
		old := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace}}
		if err := w.Client.Delete(ctx, old); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("replacing the %s's Secret %s/%s: %w", spec.Noun, s.Namespace, s.Name, err)
		}
		err = w.Client.Create(ctx, s)
	}
	if err != nil {
		return fmt.Errorf("writing the %s's Secret %s/%s: %w", spec.Noun, s.Namespace, s.Name, err)
	}
	return nil
}

// workerPodSecurity runs a worker as contract.WorkerUID, never as root.
func workerPodSecurity() *corev1.PodSecurityContext {
	uid := int64(contract.WorkerUID)
	return &corev1.PodSecurityContext{
		RunAsNonRoot:   ptr.To(true),
		RunAsUser:      ptr.To(uid),
		RunAsGroup:     ptr.To(uid),
		FSGroup:        ptr.To(uid),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// Cleanup implements Cleaner: the worker's Secret and scratch claim are
// deleted, and the worker pod, unless retained; then it is detached from
// the target so that it outlives it.
func (w *WorkerPhase) Cleanup(ctx context.Context, f *Flow, retain bool) error {
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.Prime.Namespace, Name: WorkerSecretName(w.Worker.PodName(f.Prime))}}
	if err := w.Client.Delete(ctx, secret); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting Secret %s/%s: %w", secret.Namespace, secret.Name, err)
	}
	if err := w.deleteScratch(ctx, f); err != nil {
		return err
	}
	pod := &corev1.Pod{}
	if err := w.Client.Get(ctx, types.NamespacedName{Namespace: f.Prime.Namespace, Name: w.Worker.PodName(f.Prime)}, pod); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !retain {
		return client.IgnoreNotFound(w.Client.Delete(ctx, pod))
	}
	patch := client.MergeFrom(pod.DeepCopy())
	pod.OwnerReferences = nil
	return client.IgnoreNotFound(w.Client.Patch(ctx, pod, patch))
}

func (w *WorkerPhase) now() time.Time {
	if w.Now != nil {
		return w.Now()
	}
	return time.Now()
}

// ownedBy makes target the controller owner of an object in namespace. Owner
// references cannot cross namespaces: an object in another namespace (a
// clone's prime in the source namespace) gets none, and is found through its
// cdi.kubevirt.io/OwnedByUID label by the kind's Finalizer instead.
func ownedBy(target *corev1.PersistentVolumeClaim, namespace string) []metav1.OwnerReference {
	if namespace != target.Namespace {
		return nil
	}
	return []metav1.OwnerReference{{
		APIVersion: "v1", Kind: "PersistentVolumeClaim", Name: target.Name, UID: target.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
	}}
}

// workerLabels are the labels of a worker pod and the objects serving it.
func workerLabels(target *corev1.PersistentVolumeClaim, component string) map[string]string {
	return map[string]string{
		cdiv1.LabelApp:          cdiv1.LabelAppValue,
		cdiv1.LabelComponent:    component,
		cdiv1.LabelOwnedByUID:   string(target.UID),
		cdiv1.LabelAppComponent: component,
		cdiv1.LabelAppManagedBy: "kubefill",
	}
}
