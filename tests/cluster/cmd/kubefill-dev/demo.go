package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

const demoNamespace = "kubefill-demo"

// runDemo shows the cluster's storage at work: a PVC on the default storage
// class is provisioned and bound, a pod writes into it, a second pod reads
// it back.
func runDemo(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "admin kubeconfig of the cluster")
	importDir := fs.String("import-from-dir", "", "also import a qcow2 through a DataVolume and upload one with `kubefill upload` (needs Kubefill, `up --kubefill`); the cluster dir `up` used")
	_ = fs.Parse(args)
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	_, err = client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: demoNamespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create namespace: %w", err)
	}
	if err := poll(ctx, func() (bool, error) {
		_, err := client.CoreV1().ServiceAccounts(demoNamespace).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	}); err != nil {
		return fmt.Errorf("default service account: %w", err)
	}
	name := fmt.Sprintf("demo-%d", time.Now().Unix())
	start := time.Now()
	_, err = client.CoreV1().PersistentVolumeClaims(demoNamespace).Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create PVC: %w", err)
	}
	var pvc *corev1.PersistentVolumeClaim
	if err := poll(ctx, func() (bool, error) {
		pvc, err = client.CoreV1().PersistentVolumeClaims(demoNamespace).Get(ctx, name, metav1.GetOptions{})
		return err == nil && pvc.Status.Phase == corev1.ClaimBound, nil
	}); err != nil {
		return fmt.Errorf("PVC %s never bound: %w", name, err)
	}
	fmt.Printf("PVC %s/%s: %s to %s (storage class %s) in %s\n", demoNamespace, name, pvc.Status.Phase, pvc.Spec.VolumeName,
		ptr.Deref(pvc.Spec.StorageClassName, ""), time.Since(start).Round(time.Millisecond))

	msg := fmt.Sprintf("written by a pod at %s", time.Now().UTC().Format(time.RFC3339))
	if _, err := runDemoPod(ctx, client, name+"-writer", name, fmt.Sprintf("echo '%s' > /data/hello.txt && sync", msg)); err != nil {
		return err
	}
	fmt.Printf("pod %s-writer: Succeeded (wrote /data/hello.txt)\n", name)
	got, err := runDemoPod(ctx, client, name+"-reader", name, "cat /data/hello.txt > /dev/termination-log")
	if err != nil {
		return err
	}
	fmt.Printf("pod %s-reader: Succeeded, read back: %s", name, got)
	if got != msg+"\n" {
		return fmt.Errorf("read back %q, wrote %q", got, msg)
	}
	if *importDir == "" {
		return nil
	}
	st, err := cluster.LoadState(*importDir)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "kubefill-demo-image-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	name, size, sum, err := demoImage(dir)
	if err != nil {
		return err
	}
	disk := demoDisk{path: filepath.Join(dir, name), size: size, sha: sum}
	if err := runImportDemo(ctx, cfg, client, st.HostAddress(), disk); err != nil {
		return err
	}
	return runUploadDemo(ctx, client, *kubeconfig, *importDir, disk)
}

func runDemoPod(ctx context.Context, client kubernetes.Interface, name, claim, script string) (string, error) {
	_, err := client.CoreV1().Pods(demoNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "main", Image: cluster.ShellImage, Command: []string{"sh", "-c", script},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create pod %s: %w", name, err)
	}
	var pod *corev1.Pod
	if err := poll(ctx, func() (bool, error) {
		pod, err = client.CoreV1().Pods(demoNamespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		// An image that cannot be pulled never will be here (nothing is
		// pulled from outside): say so now rather than at the timeout.
		for _, cs := range pod.Status.ContainerStatuses {
			if w := cs.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") {
				return false, fmt.Errorf("image %s: %s: %s", cs.Image, w.Reason, w.Message)
			}
		}
		return kit.Terminal(pod.Status.Phase), nil
	}); err != nil {
		state := ""
		if pod != nil {
			state = fmt.Sprintf(" (%s %+v)", pod.Status.Phase, pod.Status.ContainerStatuses)
		}
		return "", fmt.Errorf("pod %s never finished%s: %w", name, state, err)
	}
	if pod.Status.Phase != corev1.PodSucceeded || len(pod.Status.ContainerStatuses) == 0 || pod.Status.ContainerStatuses[0].State.Terminated == nil {
		return "", fmt.Errorf("pod %s: %s %+v", name, pod.Status.Phase, pod.Status.ContainerStatuses)
	}
	return pod.Status.ContainerStatuses[0].State.Terminated.Message, nil
}

func poll(ctx context.Context, cond func() (bool, error)) error {
	for {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.New("timed out")
		case <-time.After(200 * time.Millisecond):
		}
	}
}
