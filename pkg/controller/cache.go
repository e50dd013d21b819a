package controller

import (
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// managerCache is what the manager's informers keep. On a busy cluster
// most claims and nearly all pods are none of Kubefill's business, yet it
// must see them all: any claim may be a clone's source and any pod may hold
// one (CloneSourceInUse). So every object is kept without its
// managedFields, which the controller never reads (an update with none
// leaves the server's as they are), and pods that are not Kubefill's
// workers only with what the clone's source checks read (see SlimPod).
// Deployments are cached in the install namespace only (installCache).
func managerCache(installNS string) ctrlcache.Options {
	opts := installCache(installNS)
	opts.DefaultTransform = ctrlcache.TransformStripManagedFields()
	opts.ByObject[&corev1.Pod{}] = ctrlcache.ByObject{Transform: podTransform}
	return opts
}

// cacheNamespaces is the cache's DefaultNamespaces for ManagerOptions'
// Namespaces (only) and ExcludeNamespaces (exclude): nil, every namespace,
// when neither is set; the ones named in only and the install namespace;
// or every namespace but the excluded ones, through a field selector on
// metadata.namespace. Pure.
func cacheNamespaces(installNS string, only, exclude []string) (map[string]ctrlcache.Config, error) {
	if len(only) > 0 && len(exclude) > 0 {
		return nil, errors.New("the manager's Namespaces and ExcludeNamespaces options exclude each other: set one")
	}
	if slices.Contains(only, "") || slices.Contains(exclude, "") {
		return nil, errors.New("an empty namespace name in the manager's Namespaces or ExcludeNamespaces")
	}
	switch {
	case len(only) > 0:
		out := map[string]ctrlcache.Config{}
		for _, ns := range append(slices.Clone(only), installNS) {
			if ns != "" {
				out[ns] = ctrlcache.Config{}
			}
		}
		return out, nil
	case len(exclude) > 0:
		if slices.Contains(exclude, installNS) {
			return nil, fmt.Errorf("the manager cannot leave out its own install namespace %s", installNS)
		}
		sorted := slices.Sorted(slices.Values(exclude))
		sels := make([]fields.Selector, 0, len(sorted))
		for _, ns := range slices.Compact(sorted) {
			sels = append(sels, fields.OneTermNotEqualSelector("metadata.namespace", ns))
		}
		return map[string]ctrlcache.Config{ctrlcache.AllNamespaces: {FieldSelector: fields.AndSelectors(sels...)}}, nil
	}
	return nil, nil
}

// podTransform keeps worker pods whole (without managedFields) and others
// slim.
func podTransform(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		// A tombstone or another type: what the default would do.
		return ctrlcache.TransformStripManagedFields()(obj)
	}
	if IsWorkerPod(pod) {
		pod.ManagedFields = nil
		return pod, nil
	}
	return SlimPod(pod), nil
}

var _ cache.TransformFunc = podTransform

// IsWorkerPod reports whether pod is one Kubefill made (importer, upload
// server, clone source or target, poller): it carries CDI's app label or
// Kubefill's owner label. Pure.
func IsWorkerPod(pod *corev1.Pod) bool {
	if pod.Labels[cdiv1.LabelApp] == cdiv1.LabelAppValue {
		return true
	}
	_, owned := pod.Labels[cdiv1.LabelOwnedByUID]
	return owned
}

// SlimPod is what the controller needs of a pod that is not its own: its
// identity, labels, owners and deletion, its claim volumes and the
// containers' mounts of them (which claims it uses, and whether writable),
// its node and its phase. Annotations, images, commands, environment,
// probes, resources and the rest of the status are left out. Pure.
func SlimPod(pod *corev1.Pod) *corev1.Pod {
	out := &corev1.Pod{
		TypeMeta: pod.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name:                       pod.Name,
			Namespace:                  pod.Namespace,
			UID:                        pod.UID,
			ResourceVersion:            pod.ResourceVersion,
			Generation:                 pod.Generation,
			CreationTimestamp:          pod.CreationTimestamp,
			DeletionTimestamp:          pod.DeletionTimestamp,
			DeletionGracePeriodSeconds: pod.DeletionGracePeriodSeconds,
			Labels:                     pod.Labels,
			OwnerReferences:            pod.OwnerReferences,
			Finalizers:                 pod.Finalizers,
		},
		Spec:   corev1.PodSpec{NodeName: pod.Spec.NodeName},
		Status: corev1.PodStatus{Phase: pod.Status.Phase},
	}
	claims := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			out.Spec.Volumes = append(out.Spec.Volumes, corev1.Volume{Name: v.Name,
				VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: v.PersistentVolumeClaim}})
			claims[v.Name] = true
		}
	}
	slim := func(cs []corev1.Container) []corev1.Container {
		var out []corev1.Container
		for _, c := range cs {
			var mounts []corev1.VolumeMount
			for _, m := range c.VolumeMounts {
				if claims[m.Name] {
					mounts = append(mounts, corev1.VolumeMount{Name: m.Name, ReadOnly: m.ReadOnly, MountPath: m.MountPath})
				}
			}
			out = append(out, corev1.Container{Name: c.Name, VolumeMounts: mounts})
		}
		return out
	}
	out.Spec.InitContainers = slim(pod.Spec.InitContainers)
	out.Spec.Containers = slim(pod.Spec.Containers)
	return out
}
