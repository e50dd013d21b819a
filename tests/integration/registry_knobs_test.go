package integration

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/contract"
	"github.com/kubefill/kubefill/pkg/populators"
	"github.com/kubefill/kubefill/tests/kit"
)

// TestImporterPodInsecureRegistryAndProxyCA (C10, C4): with CDIConfig
// listing a registry in spec.insecureRegistries and naming a trustedCAProxy
// ConfigMap in the install namespace, a registry import from that registry
// runs an importer with INSECURE_TLS=true and one from another without; both
// mount the proxy's CA at /proxycerts from their worker Secret, which holds
// the ConfigMap's bundle. Serial: it edits the CDIConfig.
func TestImporterPodInsecureRegistryAndProxyCA(t *testing.T) {
	ctx := context.Background()
	ns, installNS := newNamespace(t), newNamespace(t)
	className := ns + "-csi"
	csiClass(t, className, "hostpath.csi.kubefill.test", storagev1.VolumeBindingImmediate, rwoFilesystem)
	const (
		insecureHost = "registry.kubefill-insecure.test:5000"
		caName       = "proxy-ca"
		caPEM        = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
		proxyURL     = "http://proxy.kubefill.test:3128"
	)
	mustCreate(t, k8sClient, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: installNS, Name: caName}, Data: map[string]string{"ca.crt": caPEM}})

	config := &cdiv1.CDIConfig{ObjectMeta: metav1.ObjectMeta{Name: cdiv1.CDIConfigName}}
	if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(config), config); apierrors.IsNotFound(err) {
		mustCreate(t, k8sClient, config)
	} else if err != nil {
		t.Fatal(err)
	}
	oldProxy, oldInsecure, oldStatusProxy := config.Spec.ImportProxy, config.Spec.InsecureRegistries, config.Status.ImportProxy
	config.Spec.ImportProxy = &cdiv1.ImportProxy{HTTPSProxy: ptr.To(proxyURL), TrustedCAProxy: ptr.To(caName)}
	config.Spec.InsecureRegistries = append(slices.Clone(oldInsecure), insecureHost)
	if err := k8sClient.Update(ctx, config); err != nil {
		t.Fatal(err)
	}
	// The status too: this test's CDIConfig reconciler is gone by then, and
	// a trustedCAProxy left in the status would send later tests' importers
	// looking for a ConfigMap their install namespace lacks.
	t.Cleanup(func() {
		c := &cdiv1.CDIConfig{}
		if err := k8sClient.Get(context.Background(), client.ObjectKeyFromObject(config), c); err != nil {
			return
		}
		c.Spec.ImportProxy, c.Spec.InsecureRegistries = oldProxy, oldInsecure
		if err := k8sClient.Update(context.Background(), c); err != nil {
			t.Errorf("restoring CDIConfig's spec: %v", err)
			return
		}
		c.Status.ImportProxy = oldStatusProxy
		if err := k8sClient.Status().Update(context.Background(), c); err != nil {
			t.Errorf("restoring CDIConfig's status: %v", err)
		}
	})
	startUploadManager(t, installNS)
	kit.Until(t, 30*time.Second, "CDIConfig's status to name the proxy's CA", func() bool {
		_ = k8sClient.Get(ctx, client.ObjectKeyFromObject(config), config)
		return populators.TrustedCAProxy(config) == caName
	})

	for _, c := range []struct {
		name, url    string
		wantInsecure bool
	}{
		{"listed", "docker://" + insecureHost + "/vm/disk:v1", true},
		// Listed without its port, as CDI compares host[:port] exactly.
		{"unlisted", "docker://registry.kubefill-insecure.test/vm/disk:v1", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			mustCreate(t, k8sClient, &cdiv1.VolumeImportSource{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: c.name},
				Spec: cdiv1.VolumeImportSourceSpec{Source: &cdiv1.ImportSourceType{Registry: &cdiv1.DataVolumeSourceRegistry{URL: ptr.To(c.url)}}}})
			target := kit.PVC(ns, c.name, "1Gi", kit.Class(className), kit.SourceRef(cdiv1.VolumeImportSourceRef, c.name))
			mustCreate(t, k8sClient, target)
			podName := cdiv1.ImporterPodName(cdiv1.PrimeName(string(target.UID)))
			pod := &corev1.Pod{}
			kit.Until(t, 30*time.Second, "the importer pod", func() bool {
				return k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: podName}, pod) == nil
			})
			ctr := pod.Spec.Containers[0]
			env := map[string]string{}
			for _, e := range ctr.Env {
				env[e.Name] = e.Value
			}
			if got := env[contract.EnvInsecureTLS] == "true"; got != c.wantInsecure {
				t.Errorf("INSECURE_TLS set %v, want %v: env %+v", got, c.wantInsecure, ctr.Env)
			}
			if env[contract.EnvProxyCertDir] != contract.ProxyCertDir {
				t.Errorf("%s = %q, want %s", contract.EnvProxyCertDir, env[contract.EnvProxyCertDir], contract.ProxyCertDir)
			}
			secretName := populators.WorkerSecretName(podName)
			i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == contract.ProxyCertVolume })
			if i < 0 || pod.Spec.Volumes[i].Secret == nil || pod.Spec.Volumes[i].Secret.SecretName != secretName || len(pod.Spec.Volumes[i].Secret.Items) != 1 {
				t.Fatalf("volumes %+v, want %s from Secret %s", pod.Spec.Volumes, contract.ProxyCertVolume, secretName)
			}
			if !slices.ContainsFunc(ctr.VolumeMounts, func(m corev1.VolumeMount) bool {
				return m.Name == contract.ProxyCertVolume && m.MountPath == contract.ProxyCertDir && m.ReadOnly
			}) {
				t.Errorf("mounts %+v, want %s read-only at %s", ctr.VolumeMounts, contract.ProxyCertVolume, contract.ProxyCertDir)
			}
			secret := &corev1.Secret{}
			if err := k8sClient.Get(ctx, types.NamespacedName{Namespace: ns, Name: secretName}, secret); err != nil {
				t.Fatalf("the importer's Secret: %v", err)
			}
			if key := pod.Spec.Volumes[i].Secret.Items[0].Key; string(secret.Data[key]) != caPEM {
				t.Errorf("Secret %s key %s = %q, want the ConfigMap's CA", secretName, key, secret.Data[key])
			}
		})
	}
}
