package controller

import (
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/populators"
)

// DefaultPollerServiceAccount runs the poller pods (manifests/install/poller-rbac.yaml);
// CDI's is cdi-cronjob.
const DefaultPollerServiceAccount = "kubefill-cronjob"

// pollerContainerName is CDI's name for the poller's container.
const pollerContainerName = "cdi-source-update-poller"

// pollerSpec is what the poller's pods run with.
type pollerSpec struct {
	Image          string
	PullPolicy     corev1.PullPolicy
	ServiceAccount string
	// Insecure: the registry is listed in CDIConfig spec.insecureRegistries.
	Insecure bool
	Proxy    *cdiv1.ImportProxy
	// ProxyCA is the ConfigMap, in the install namespace, of the proxy's
	// CA bundle (importProxy.trustedCAProxy); "" when none.
	ProxyCA string
	// Placement is the CDI resource's spec.workload.
	Placement cdiv1.NodePlacement
	// PullSecrets are CDIConfig's imagePullSecrets, in the install
	// namespace as in every other.
	PullSecrets []corev1.LocalObjectReference
	// Secret and CertConfigMap are the copies, in the install namespace, of
	// the cron's secretRef and certConfigMap (PollerCopyName); empty when
	// the cron names none.
	Secret, CertConfigMap string
}

// pollerPodSpec renders the poller's pod: `kubefill poller` with CDI's
// flags, the registry's credentials and CA (the copies p names, never the
// names the cron gives, which are the cron's namespace's objects), and the
// restricted Pod Security profile (it writes nothing, so no fsGroup).
func pollerPodSpec(cron *cdiv1.DataImportCron, p pollerSpec) corev1.PodTemplateSpec {
	reg := cron.Spec.Template.Spec.Source.Registry
	c := corev1.Container{
		Name:                     pollerContainerName,
		Image:                    p.Image,
		Command:                  []string{"kubefill", "poller", "-ns", cron.Namespace, "-cron", cron.Name, "-url", ptr.Deref(reg.URL, "")},
		ImagePullPolicy:          p.PullPolicy,
		TerminationMessagePath:   corev1.TerminationMessagePathDefault,
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
	}
	if c.Image == "" {
		c.Image = contract.DefaultImage
	}
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = corev1.PullIfNotPresent
	}
	var volumes []corev1.Volume
	if cm := p.CertConfigMap; cm != "" {
		volumes = append(volumes, corev1.Volume{Name: contract.CertVolumeName, VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: cm}, DefaultMode: ptr.To[int32](0o644)}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: contract.CertVolumeName, MountPath: contract.CertDir, ReadOnly: true})
		c.Command = append(c.Command, "-certdir", contract.CertDir)
	}
	if cm := p.ProxyCA; cm != "" {
		volumes = append(volumes, corev1.Volume{Name: contract.ProxyCertVolume, VolumeSource: corev1.VolumeSource{
			ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: cm}, DefaultMode: ptr.To[int32](0o644)}}})
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: contract.ProxyCertVolume, MountPath: contract.ProxyCertDir, ReadOnly: true})
		c.Env = append(c.Env, corev1.EnvVar{Name: contract.EnvProxyCertDir, Value: contract.ProxyCertDir})
	}
	if secret := p.Secret; secret != "" {
		for _, kv := range [][2]string{{contract.EnvAccessKeyID, "accessKeyId"}, {contract.EnvSecretKey, "secretKey"}} {
			c.Env = append(c.Env, corev1.EnvVar{Name: kv[0], ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: kv[1]}}})
		}
	}
	if p.Insecure {
		c.Env = append(c.Env, corev1.EnvVar{Name: contract.EnvInsecureTLS, Value: "true"})
	}
	if px := p.Proxy; px != nil {
		for _, kv := range []struct {
			name string
			v    *string
		}{{contract.EnvHTTPProxy, px.HTTPProxy}, {contract.EnvHTTPSProxy, px.HTTPSProxy}, {contract.EnvNoProxy, px.NoProxy}} {
			if ptr.Deref(kv.v, "") != "" {
				c.Env = append(c.Env, corev1.EnvVar{Name: kv.name, Value: *kv.v})
			}
		}
	}
	sa := p.ServiceAccount
	if sa == "" {
		sa = DefaultPollerServiceAccount
	}
	return corev1.PodTemplateSpec{
		// Out of service meshes as worker pods are: a sidecar that never
		// exits would keep the poller's Job from completing.
		ObjectMeta: metav1.ObjectMeta{Labels: pollerLabels(cron), Annotations: populators.WorkerPodAnnotations(nil)},
		Spec: corev1.PodSpec{
			Containers:                    []corev1.Container{c},
			Volumes:                       volumes,
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			ServiceAccountName:            sa,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(true),
				RunAsUser:      ptr.To[int64](contract.WorkerUID),
				RunAsGroup:     ptr.To[int64](contract.WorkerUID),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			ImagePullSecrets: p.PullSecrets,
			NodeSelector:     p.Placement.NodeSelector,
			Affinity:         p.Placement.Affinity,
			Tolerations:      p.Placement.Tolerations,
		},
	}
}

// pollerLabels mark a cron's CronJob, Jobs and pods: CDI's two cron labels.
func pollerLabels(cron *cdiv1.DataImportCron) map[string]string {
	return map[string]string{
		cdiv1.LabelDataImportCron:   cron.Name,
		cdiv1.LabelDataImportCronNs: cron.Namespace,
		cdiv1.LabelAppManagedBy:     "kubefill",
		cdiv1.LabelAppComponent:     "poller",
		// The poller talks to the API server: network policies let it.
		cdiv1.LabelAllowAccessClusterServices: "true",
	}
}

// applyCronJob sets what Kubefill decides on a poller CronJob, leaving the
// fields the API server defaults as they are, so an unchanged CronJob
// compares equal and is not rewritten.
func applyCronJob(cj *batchv1.CronJob, cron *cdiv1.DataImportCron, p pollerSpec) {
	if cj.Labels == nil {
		cj.Labels = map[string]string{}
	}
	for k, v := range pollerLabels(cron) {
		cj.Labels[k] = v
	}
	s := &cj.Spec
	s.Schedule = cron.Spec.Schedule
	s.ConcurrencyPolicy = batchv1.ForbidConcurrent
	s.SuccessfulJobsHistoryLimit = ptr.To[int32](1)
	s.FailedJobsHistoryLimit = ptr.To[int32](1)
	applyJobSpec(&s.JobTemplate.Spec, cron, p)
}

func applyJobSpec(js *batchv1.JobSpec, cron *cdiv1.DataImportCron, p pollerSpec) {
	js.BackoffLimit = ptr.To[int32](2)
	js.TTLSecondsAfterFinished = ptr.To[int32](10)
	want := pollerPodSpec(cron, p)
	tpl := &js.Template
	if tpl.Labels == nil {
		tpl.Labels = map[string]string{}
	}
	for k, v := range want.Labels {
		tpl.Labels[k] = v
	}
	if tpl.Annotations == nil {
		tpl.Annotations = map[string]string{}
	}
	for k, v := range want.Annotations {
		tpl.Annotations[k] = v
	}
	ps := &tpl.Spec
	ps.Containers = want.Spec.Containers
	ps.Volumes = want.Spec.Volumes
	ps.RestartPolicy = want.Spec.RestartPolicy
	ps.TerminationGracePeriodSeconds = want.Spec.TerminationGracePeriodSeconds
	ps.ServiceAccountName = want.Spec.ServiceAccountName
	ps.SecurityContext = want.Spec.SecurityContext
	ps.NodeSelector, ps.Affinity, ps.Tolerations = want.Spec.NodeSelector, want.Spec.Affinity, want.Spec.Tolerations
	ps.ImagePullSecrets = want.Spec.ImagePullSecrets
}

// newPollerCronJob and newInitialJob render the poller's objects in the
// install namespace.
func newPollerCronJob(cron *cdiv1.DataImportCron, namespace string, p pollerSpec) *batchv1.CronJob {
	cj := &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: CronJobName(cron), Namespace: namespace}}
	applyCronJob(cj, cron, p)
	return cj
}

func newInitialJob(cron *cdiv1.DataImportCron, namespace string, p pollerSpec) *batchv1.Job {
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: InitialJobName(cron), Namespace: namespace, Labels: pollerLabels(cron)}}
	applyJobSpec(&job.Spec, cron, p)
	return job
}
