package populators

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/certs"
)

// WorkloadPlacement is where worker and poller pods run: the active CDI
// resource's spec.workload (the one certs.ActiveCDI picks, as for every
// other setting the CDI resource holds), or no constraint without one.
// It is a copy: a pod built from it must not share maps with the cache. Pure.
func WorkloadPlacement(cdis []cdiv1.CDI) cdiv1.NodePlacement {
	active := certs.ActiveCDI(cdis)
	if active == nil {
		return cdiv1.NodePlacement{}
	}
	return *active.Spec.Workloads.DeepCopy()
}

// ReadWorkloadPlacement lists the CDI resources and returns their
// WorkloadPlacement.
func ReadWorkloadPlacement(ctx context.Context, c client.Reader) (cdiv1.NodePlacement, error) {
	cdis := &cdiv1.CDIList{}
	if err := c.List(ctx, cdis); err != nil {
		return cdiv1.NodePlacement{}, fmt.Errorf("reading the CDI resource's workload placement: %w", err)
	}
	return WorkloadPlacement(cdis.Items), nil
}

// WorkerPullPolicy is the worker image's pull policy: the active CDI
// resource's spec.imagePullPolicy, which CDI's operator gives every
// component and, through its controller, the worker pods; else fallback
// (the controller's --worker-pull-policy). Pure.
func WorkerPullPolicy(cdis []cdiv1.CDI, fallback corev1.PullPolicy) corev1.PullPolicy {
	if active := certs.ActiveCDI(cdis); active != nil && active.Spec.ImagePullPolicy != "" {
		return active.Spec.ImagePullPolicy
	}
	return fallback
}

// ReadWorkerPullPolicy lists the CDI resources and returns their
// WorkerPullPolicy.
func ReadWorkerPullPolicy(ctx context.Context, c client.Reader, fallback corev1.PullPolicy) (corev1.PullPolicy, error) {
	cdis := &cdiv1.CDIList{}
	if err := c.List(ctx, cdis); err != nil {
		return "", fmt.Errorf("reading the CDI resource's image pull policy: %w", err)
	}
	return WorkerPullPolicy(cdis.Items, fallback), nil
}

// workerPodAnnotationDefaults are the claim annotations a worker pod
// carries, each with its value where the claim gives none: worker pods
// stay out of Istio and Linkerd meshes unless the user asks for a sidecar,
// since a sidecar that never exits keeps the pod from completing.
var workerPodAnnotationDefaults = map[string]string{
	cdiv1.AnnPodNetwork:                 "",
	cdiv1.AnnPodMultusDefaultNetwork:    "",
	cdiv1.AnnPodSidecarInjectionIstio:   cdiv1.AnnPodSidecarInjectionIstioDefault,
	cdiv1.AnnPodSidecarInjectionLinkerd: cdiv1.AnnPodSidecarInjectionLinkerdDefault,
}

// WorkerPodAnnotationKeys are the annotations a DataVolume passes to its
// claim, and a target to its prime, for the worker pods.
var WorkerPodAnnotationKeys = []string{
	cdiv1.AnnPodNetwork, cdiv1.AnnPodMultusDefaultNetwork,
	cdiv1.AnnPodSidecarInjectionIstio, cdiv1.AnnPodSidecarInjectionLinkerd,
}

// WorkerPodAnnotations are the network and mesh annotations of a worker pod
// for a claim with annotations claim: the claim's value of each, or the
// default where the claim has none. A key the claim sets to "" is left off
// the pod (no opt-out either), as CDI does. Pure.
func WorkerPodAnnotations(claim map[string]string) map[string]string {
	out := map[string]string{}
	for key, def := range workerPodAnnotationDefaults {
		v, ok := claim[key]
		if !ok {
			v = def
		}
		if v != "" {
			out[key] = v
		}
	}
	return out
}

// workerPullSecrets are the pull secrets of a worker pod: CDIConfig's, in
// force in its status; copied, as the config comes from the cache.
func workerPullSecrets(config *cdiv1.CDIConfig) []corev1.LocalObjectReference {
	if len(config.Status.ImagePullSecrets) == 0 {
		return nil
	}
	return append([]corev1.LocalObjectReference(nil), config.Status.ImagePullSecrets...)
}
