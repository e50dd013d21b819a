package controller

import (
	"context"
	"encoding/json"
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// The install's Deployments (manifests/install) that CDI.spec.infra places,
// as CDI's operator places cdi-deployment, cdi-apiserver and cdi-uploadproxy.
const (
	ControllerDeploymentName  = "kubefill-controller"
	APIServerDeploymentName   = "kubefill-apiserver"
	UploadProxyDeploymentName = "kubefill-uploadproxy"
)

// InfraDeploymentNames are the Deployments placed, the controller's own
// last: patching it restarts this process, so the others are done first.
var InfraDeploymentNames = []string{APIServerDeploymentName, UploadProxyDeploymentName, ControllerDeploymentName}

// InfraFields are the fields of an install Deployment that the CDI resource
// sets; the manifest's values are kept in cdiv1.AnnManifestPlacement as this.
type InfraFields struct {
	Replicas          *int32              `json:"replicas,omitempty"`
	NodeSelector      map[string]string   `json:"nodeSelector,omitempty"`
	Affinity          *corev1.Affinity    `json:"affinity,omitempty"`
	Tolerations       []corev1.Toleration `json:"tolerations,omitempty"`
	PriorityClassName string              `json:"priorityClassName,omitempty"`
	// ImagePullPolicies is each container's (and init container's) policy, by name.
	ImagePullPolicies map[string]corev1.PullPolicy `json:"imagePullPolicies,omitempty"`
}

// InfraWant is what the honoured CDI resource asks of the install's
// Deployments; the zero value (no CDI resource) asks for the manifests'.
type InfraWant struct {
	Infra           cdiv1.ComponentConfig
	ImagePullPolicy corev1.PullPolicy
	// PriorityClassName is the resolved class: "" when the one CDIPriorityClass
	// names does not exist.
	PriorityClassName string
}

// InfraWantOf is what a CDI resource's spec asks, given the priority class
// that resolved (see CDIPriorityClassName).
func InfraWantOf(spec *cdiv1.CDISpec, priorityClass string) InfraWant {
	return InfraWant{Infra: *spec.Infra.DeepCopy(), ImagePullPolicy: spec.ImagePullPolicy, PriorityClassName: priorityClass}
}

// CDIPriorityClassName is the priority class CDI's operator gives its
// Deployments: spec.priorityClass, else kubevirt-cluster-critical; either
// only if it exists, which the caller checks. Pure.
func CDIPriorityClassName(spec *cdiv1.CDISpec) string {
	if spec.PriorityClass != nil && *spec.PriorityClass != "" {
		return string(*spec.PriorityClass)
	}
	return cdiv1.DefaultInfraPriorityClass
}

// infraReplicas is the replicas field of spec.infra that sizes Deployment name.
func infraReplicas(infra cdiv1.ComponentConfig, name string) *int32 {
	switch name {
	case ControllerDeploymentName:
		return infra.DeploymentReplicas
	case APIServerDeploymentName:
		return infra.APIServerReplicas
	case UploadProxyDeploymentName:
		return infra.UploadProxyReplicas
	}
	return nil
}

// infraFieldsOf reads the fields from a Deployment.
func infraFieldsOf(d *appsv1.Deployment) InfraFields {
	pod := &d.Spec.Template.Spec
	f := InfraFields{Replicas: d.Spec.Replicas, NodeSelector: pod.NodeSelector, Affinity: pod.Affinity,
		Tolerations: pod.Tolerations, PriorityClassName: pod.PriorityClassName}
	for _, cs := range [][]corev1.Container{pod.InitContainers, pod.Containers} {
		for _, c := range cs {
			if f.ImagePullPolicies == nil {
				f.ImagePullPolicies = map[string]corev1.PullPolicy{}
			}
			f.ImagePullPolicies[c.Name] = c.ImagePullPolicy
		}
	}
	return *f.deepCopy()
}

func (f *InfraFields) deepCopy() *InfraFields {
	out := *f
	if f.Replicas != nil {
		out.Replicas = new(int32)
		*out.Replicas = *f.Replicas
	}
	if f.NodeSelector != nil {
		out.NodeSelector = make(map[string]string, len(f.NodeSelector))
		for k, v := range f.NodeSelector {
			out.NodeSelector[k] = v
		}
	}
	out.Affinity = f.Affinity.DeepCopy()
	if f.Tolerations != nil {
		out.Tolerations = make([]corev1.Toleration, len(f.Tolerations))
		for i := range f.Tolerations {
			f.Tolerations[i].DeepCopyInto(&out.Tolerations[i])
		}
	}
	if f.ImagePullPolicies != nil {
		out.ImagePullPolicies = make(map[string]corev1.PullPolicy, len(f.ImagePullPolicies))
		for k, v := range f.ImagePullPolicies {
			out.ImagePullPolicies[k] = v
		}
	}
	return &out
}

// setInfraFields writes the fields into a Deployment; a container the
// fields do not name keeps its policy.
func setInfraFields(d *appsv1.Deployment, f InfraFields) {
	pod := &d.Spec.Template.Spec
	d.Spec.Replicas, pod.NodeSelector, pod.Affinity, pod.Tolerations, pod.PriorityClassName =
		f.Replicas, f.NodeSelector, f.Affinity, f.Tolerations, f.PriorityClassName
	for _, cs := range [][]corev1.Container{pod.InitContainers, pod.Containers} {
		for i := range cs {
			if p, ok := f.ImagePullPolicies[cs[i].Name]; ok {
				cs[i].ImagePullPolicy = p
			}
		}
	}
}

// PlaceDeployment decides an install Deployment's placement fields, as
// CDI's operator renders them from the CDI resource: spec.infra's
// nodeSelector, affinity and tolerations, its replicas field for this
// Deployment (1 or more; CDI's floor is 1), the resolved priority class and
// spec.imagePullPolicy for every container. What the resource leaves unset
// keeps the manifest's value: the Deployment's own before the first change,
// then the copy kept in cdiv1.AnnManifestPlacement, which goes once nothing
// differs from it. It returns the Deployment to patch to and whether it
// differs from d (false: write nothing). Pure.
func PlaceDeployment(d *appsv1.Deployment, want InfraWant) (*appsv1.Deployment, bool, error) {
	manifest := infraFieldsOf(d)
	if saved, ok := d.Annotations[cdiv1.AnnManifestPlacement]; ok {
		manifest = InfraFields{}
		if err := json.Unmarshal([]byte(saved), &manifest); err != nil {
			return nil, false, fmt.Errorf("reading annotation %s of Deployment %s/%s: %w", cdiv1.AnnManifestPlacement, d.Namespace, d.Name, err)
		}
	}
	next := *manifest.deepCopy()
	infra := want.Infra
	if r := infraReplicas(infra, d.Name); r != nil && *r >= 1 {
		next.Replicas = new(int32)
		*next.Replicas = *r
	}
	if len(infra.NodeSelector) > 0 {
		next.NodeSelector = infra.DeepCopy().NodeSelector
	}
	if infra.Affinity != nil {
		next.Affinity = infra.Affinity.DeepCopy()
	}
	if len(infra.Tolerations) > 0 {
		next.Tolerations = infra.DeepCopy().Tolerations
	}
	if want.PriorityClassName != "" {
		next.PriorityClassName = want.PriorityClassName
	}
	if want.ImagePullPolicy != "" {
		for name := range infraFieldsOf(d).ImagePullPolicies {
			if next.ImagePullPolicies == nil {
				next.ImagePullPolicies = map[string]corev1.PullPolicy{}
			}
			next.ImagePullPolicies[name] = want.ImagePullPolicy
		}
	}

	out := d.DeepCopy()
	setInfraFields(out, next)
	if equality.Semantic.DeepEqual(next, manifest) {
		delete(out.Annotations, cdiv1.AnnManifestPlacement)
	} else {
		saved, err := json.Marshal(manifest)
		if err != nil {
			return nil, false, fmt.Errorf("keeping the manifest's placement of Deployment %s/%s: %w", d.Namespace, d.Name, err)
		}
		if out.Annotations == nil {
			out.Annotations = map[string]string{}
		}
		out.Annotations[cdiv1.AnnManifestPlacement] = string(saved)
	}
	changed := !equality.Semantic.DeepEqual(infraFieldsOf(out), infraFieldsOf(d)) ||
		out.Annotations[cdiv1.AnnManifestPlacement] != d.Annotations[cdiv1.AnnManifestPlacement] ||
		hasAnnotation(out, cdiv1.AnnManifestPlacement) != hasAnnotation(d, cdiv1.AnnManifestPlacement)
	return out, changed, nil
}

func hasAnnotation(d *appsv1.Deployment, key string) bool {
	_, ok := d.Annotations[key]
	return ok
}

// infraWant reads what the honoured CDI resource asks (nil: none, the
// manifests' values), resolving its priority class as CDI's operator does:
// a class that cannot be read is left out.
func (r *CDIReconciler) infraWant(ctx context.Context, cr *cdiv1.CDI) InfraWant {
	if cr == nil {
		return InfraWant{}
	}
	name := CDIPriorityClassName(&cr.Spec)
	if err := r.Reader.Get(ctx, types.NamespacedName{Name: name}, &schedulingv1.PriorityClass{}); err != nil {
		if !apierrors.IsNotFound(err) {
			log.FromContext(ctx).Info("leaving the priority class off the install's Deployments: it cannot be read", "priorityClass", name, "error", err.Error())
		}
		name = ""
	}
	return InfraWantOf(&cr.Spec, name)
}

// placeInfra patches the install's Deployments to what want decides, each
// with only the fields PlaceDeployment sets, and only those that differ. A
// Deployment that is missing is skipped.
func (r *CDIReconciler) placeInfra(ctx context.Context, want InfraWant) error {
	for _, name := range InfraDeploymentNames {
		d := &appsv1.Deployment{}
		if err := r.Client.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: name}, d); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("reading Deployment %s/%s to place it: %w", r.Namespace, name, err)
		}
		next, changed, err := PlaceDeployment(d, want)
		if err != nil {
			return err
		}
		if !changed {
			continue
		}
		// The resourceVersion makes a patch decided from a stale read fail
		// (conflict) rather than undo a newer change.
		if err := r.Client.Patch(ctx, next, client.StrategicMergeFrom(d, client.MergeFromWithOptimisticLock{})); err != nil {
			return fmt.Errorf("placing Deployment %s/%s as the CDI resource's spec.infra asks: %w", r.Namespace, name, err)
		}
		log.FromContext(ctx).Info("placed install Deployment", "deployment", name, "restored", !hasAnnotation(next, cdiv1.AnnManifestPlacement))
	}
	return nil
}
