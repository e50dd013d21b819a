package controller

import (
	"context"
	"fmt"
	"maps"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// The poller runs in the install namespace, but the registry credentials
// (secretRef) and CA (certConfigMap) a cron names are the cron's own, in the
// cron's namespace, as for a DataVolume's import: the controller copies
// them into the install namespace under a name derived from the cron's UID,
// labelled with the cron, owned by its CronJob, refreshed on every
// reconcile, and deleted with the poller. An object of the install
// namespace is never referenced by the name a tenant wrote (CDI's poller
// mounts kubefill-system/<secretRef>, which handed the install namespace's
// Secrets to whoever named them).

// DefaultPollerCopyResync is how often a cron whose poller uses copied
// credentials or CA is reconciled to refresh the copies (the sources, the
// tenant's Secrets and ConfigMaps, are read by name and not watched).
const DefaultPollerCopyResync = time.Minute

// pollerSecretKeys are the keys of a registry Secret the poller reads
// (accessKeyId and secretKey, CDI's); only they are copied.
var pollerSecretKeys = []string{"accessKeyId", "secretKey"}

// PollerCopyName is the name of the copies, in the install namespace, of a
// cron's registry Secret and CA ConfigMap: poller-<the cron's UID>.
func PollerCopyName(cron *cdiv1.DataImportCron) string {
	return "poller-" + string(cron.UID)
}

// pollerCopyLabels mark a copy with its cron.
func pollerCopyLabels(cron *cdiv1.DataImportCron) map[string]string {
	return map[string]string{
		cdiv1.LabelDataImportCron:   cron.Name,
		cdiv1.LabelDataImportCronNs: cron.Namespace,
		cdiv1.LabelAppManagedBy:     "kubefill",
		cdiv1.LabelAppComponent:     "poller",
	}
}

// isPollerCopyOf says whether obj is a copy the controller made for the
// cron named by namespace and name: only such objects are ever deleted.
func isPollerCopyOf(obj metav1.Object, namespace, name string) bool {
	l := obj.GetLabels()
	return l[cdiv1.LabelDataImportCron] == name && l[cdiv1.LabelDataImportCronNs] == namespace &&
		l[cdiv1.LabelAppManagedBy] == "kubefill" && l[cdiv1.LabelAppComponent] == "poller"
}

// pollerSecretData is what the copy of a registry Secret holds, or a
// problem saying what is missing. Pure.
func pollerSecretData(cron *cdiv1.DataImportCron, src *corev1.Secret) (map[string][]byte, string) {
	data := map[string][]byte{}
	var missing []string
	for _, k := range pollerSecretKeys {
		v, ok := src.Data[k]
		if !ok {
			missing = append(missing, k)
			continue
		}
		data[k] = v
	}
	if len(missing) > 0 {
		return nil, fmt.Sprintf("secretRef %s: Secret %s/%s has no key %q; the poller needs %q and %q (the registry's user name and password)",
			src.Name, cron.Namespace, src.Name, missing[0], pollerSecretKeys[0], pollerSecretKeys[1])
	}
	return data, ""
}

// pollerSources are the cron's registry Secret and CA ConfigMap, read in
// the cron's namespace.
type pollerSources struct {
	secret    *corev1.Secret
	configMap *corev1.ConfigMap
}

// readPollerSources reads the cron's secretRef and certConfigMap from the
// cron's namespace; problem says which is missing and what to do.
func (r *DataImportCronReconciler) readPollerSources(ctx context.Context, cron *cdiv1.DataImportCron) (pollerSources, string, error) {
	var out pollerSources
	reg := registrySource(cron)
	if name := ptr.Deref(reg.SecretRef, ""); name != "" {
		s := &corev1.Secret{}
		if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: cron.Namespace, Name: name}, s); err != nil {
			if !apierrors.IsNotFound(err) {
				return out, "", fmt.Errorf("reading the registry Secret %s/%s of DataImportCron %s: %w", cron.Namespace, name, cron.Name, err)
			}
			return out, fmt.Sprintf("secretRef %s: Secret %s/%s does not exist; create it in the DataImportCron's namespace with keys %q and %q",
				name, cron.Namespace, name, pollerSecretKeys[0], pollerSecretKeys[1]), nil
		}
		out.secret = s
	}
	if name := ptr.Deref(reg.CertConfigMap, ""); name != "" {
		cm := &corev1.ConfigMap{}
		if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: cron.Namespace, Name: name}, cm); err != nil {
			if !apierrors.IsNotFound(err) {
				return out, "", fmt.Errorf("reading the registry CA ConfigMap %s/%s of DataImportCron %s: %w", cron.Namespace, name, cron.Name, err)
			}
			return out, fmt.Sprintf("certConfigMap %s: ConfigMap %s/%s does not exist; create it in the DataImportCron's namespace with the registry's CA certificates (PEM)",
				name, cron.Namespace, name), nil
		}
		out.configMap = cm
	}
	if out.secret != nil {
		if _, problem := pollerSecretData(cron, out.secret); problem != "" {
			return out, problem, nil
		}
	}
	return out, "", nil
}

// ensurePollerCopies writes the copies of src into the install namespace,
// owned by the poller's CronJob, and deletes a copy the cron no longer names.
func (r *DataImportCronReconciler) ensurePollerCopies(ctx context.Context, cron *cdiv1.DataImportCron, src pollerSources, cj *batchv1.CronJob) error {
	name := PollerCopyName(cron)
	meta := func() metav1.ObjectMeta {
		om := metav1.ObjectMeta{Name: name, Namespace: r.Namespace, Labels: pollerCopyLabels(cron)}
		if cj != nil && cj.UID != "" {
			om.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "CronJob", Name: cj.Name, UID: cj.UID, Controller: ptr.To(true)}}
		}
		return om
	}
	if src.secret == nil {
		if err := r.deletePollerCopy(ctx, &corev1.Secret{}, cron.Namespace, cron.Name, name); err != nil {
			return err
		}
	} else {
		data, _ := pollerSecretData(cron, src.secret)
		want := &corev1.Secret{ObjectMeta: meta(), Type: corev1.SecretTypeOpaque, Data: data}
		if err := r.writePollerCopy(ctx, "Secret", &corev1.Secret{}, want, func(cur client.Object) bool {
			s := cur.(*corev1.Secret)
			if equality.Semantic.DeepEqual(s.Data, data) {
				return false
			}
			s.Data = data
			return true
		}); err != nil {
			return err
		}
	}
	if src.configMap == nil {
		return r.deletePollerCopy(ctx, &corev1.ConfigMap{}, cron.Namespace, cron.Name, name)
	}
	data, bin := maps.Clone(src.configMap.Data), maps.Clone(src.configMap.BinaryData)
	want := &corev1.ConfigMap{ObjectMeta: meta(), Data: data, BinaryData: bin}
	return r.writePollerCopy(ctx, "ConfigMap", &corev1.ConfigMap{}, want, func(cur client.Object) bool {
		c := cur.(*corev1.ConfigMap)
		if equality.Semantic.DeepEqual(c.Data, data) && equality.Semantic.DeepEqual(c.BinaryData, bin) {
			return false
		}
		c.Data, c.BinaryData = data, bin
		return true
	})
}

// writePollerCopy creates want, or brings the existing copy's content (set
// returns whether it changed anything), labels and owner up to date. An
// object of that name that is not the cron's copy is an error, never
// overwritten.
func (r *DataImportCronReconciler) writePollerCopy(ctx context.Context, kind string, cur, want client.Object, set func(client.Object) bool) error {
	err := r.Reader.Get(ctx, client.ObjectKeyFromObject(want), cur)
	if apierrors.IsNotFound(err) {
		if err := r.Client.Create(ctx, want); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("copying the poller's %s into %s/%s: %w", kind, want.GetNamespace(), want.GetName(), err)
		}
		return nil
	}
	if err != nil {
		return err
	}
	l := want.GetLabels()
	if !isPollerCopyOf(cur, l[cdiv1.LabelDataImportCronNs], l[cdiv1.LabelDataImportCron]) {
		return fmt.Errorf("%s %s/%s exists and is not the poller's copy for DataImportCron %s/%s; not overwriting it",
			kind, cur.GetNamespace(), cur.GetName(), l[cdiv1.LabelDataImportCronNs], l[cdiv1.LabelDataImportCron])
	}
	changed := set(cur)
	if len(want.GetOwnerReferences()) > 0 && !equality.Semantic.DeepEqual(cur.GetOwnerReferences(), want.GetOwnerReferences()) {
		cur.SetOwnerReferences(want.GetOwnerReferences())
		changed = true
	}
	if !changed {
		return nil
	}
	if err := r.Client.Update(ctx, cur); err != nil {
		return fmt.Errorf("refreshing the poller's %s copy %s/%s: %w", kind, cur.GetNamespace(), cur.GetName(), err)
	}
	return nil
}

// deletePollerCopy deletes the copy name of the cron cronNS/cronName, if it
// is one.
func (r *DataImportCronReconciler) deletePollerCopy(ctx context.Context, obj client.Object, cronNS, cronName, name string) error {
	if err := r.Reader.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: name}, obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !isPollerCopyOf(obj, cronNS, cronName) {
		return nil
	}
	if err := r.Client.Delete(ctx, obj); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting the poller's copy %s/%s: %w", r.Namespace, name, err)
	}
	return nil
}

// deletePollerCopiesOf deletes the copies a poller CronJob's pods use (the
// cron may be gone, and with it its UID): the Secret and ConfigMap its pod
// template references, where they are the cron's copies.
func (r *DataImportCronReconciler) deletePollerCopiesOf(ctx context.Context, cj *batchv1.CronJob, cronNS, cronName string) error {
	secrets, configMaps := podTemplateReferences(&cj.Spec.JobTemplate.Spec.Template.Spec)
	for _, n := range secrets {
		if err := r.deletePollerCopy(ctx, &corev1.Secret{}, cronNS, cronName, n); err != nil {
			return err
		}
	}
	for _, n := range configMaps {
		if err := r.deletePollerCopy(ctx, &corev1.ConfigMap{}, cronNS, cronName, n); err != nil {
			return err
		}
	}
	return nil
}

// podTemplateReferences are the Secrets (env secretKeyRef) and ConfigMaps
// (volumes) a pod spec uses, each name once. Pure.
func podTemplateReferences(ps *corev1.PodSpec) (secrets, configMaps []string) {
	seen := map[string]bool{}
	add := func(list *[]string, kind, name string) {
		if name != "" && !seen[kind+"/"+name] {
			seen[kind+"/"+name] = true
			*list = append(*list, name)
		}
	}
	for _, c := range ps.Containers {
		for _, e := range c.Env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				add(&secrets, "secret", e.ValueFrom.SecretKeyRef.Name)
			}
		}
	}
	for _, v := range ps.Volumes {
		if v.ConfigMap != nil {
			add(&configMaps, "configmap", v.ConfigMap.Name)
		}
	}
	return secrets, configMaps
}
