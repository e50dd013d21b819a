package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// Config configures the agent.
type Config struct {
	NodeName   string
	Kubeconfig string
	// Dir holds the pods' directories (volumes, logs, roots).
	Dir string
	// CSIEndpoint is the CSI driver's unix socket; DriverName its name.
	CSIEndpoint string
	DriverName  string
	// PodSubnet is the private range pods get addresses from, and
	// LinkPrefix starts every network namespace and link name the agent
	// makes (at most 6 characters), so that teardown can find them.
	PodSubnet  string
	LinkPrefix string
	Images     ImageTable
	// HelperBinary is the kubefill-dev binary; its pod-init command starts
	// every container.
	HelperBinary string
	// KubeletVersion is what the Node reports.
	KubeletVersion string
	Logf           func(format string, args ...any)
}

const (
	leaseDuration       = 40 * time.Second
	leaseRenewInterval  = 10 * time.Second
	nodeStatusInterval  = 30 * time.Second
	terminationLogLimit = 4096
)

// Agent runs pods on one node.
type Agent struct {
	cfg      Config
	client   kubernetes.Interface
	net      *podNetwork
	csi      csi.NodeClient
	recorder record.EventRecorder

	mu      sync.Mutex
	workers map[types.UID]*podWorker
	wg      sync.WaitGroup
}

// Run registers the node and runs its pods until ctx is done; it then stops
// every pod and removes their networks and volumes.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if cfg.KubeletVersion == "" {
		cfg.KubeletVersion = "v1.37.2"
	}
	restCfg, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	restCfg.QPS, restCfg.Burst = 50, 100
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	pn, err := newPodNetwork(cfg.LinkPrefix, cfg.PodSubnet)
	if err != nil {
		return err
	}
	if err := pn.fence(); err != nil {
		return err
	}
	defer func() {
		if err := pn.unfence(); err != nil {
			cfg.Logf("node agent: %v", err)
		}
	}()
	conn, err := grpc.NewClient("unix://"+cfg.CSIEndpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("CSI client: %w", err)
	}
	defer conn.Close()

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()

	a := &Agent{
		cfg:      cfg,
		client:   client,
		net:      pn,
		csi:      csi.NewNodeClient(conn),
		recorder: broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: cfg.NodeName}),
		workers:  map[types.UID]*podWorker{},
	}
	node, err := a.registerNode(ctx)
	if err != nil {
		return err
	}
	if err := a.publishCSINode(ctx, node); err != nil {
		return err
	}
	go a.heartbeat(ctx, node)

	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String()
	}))
	inf := factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.podChanged(ctx, obj) },
		UpdateFunc: func(_, obj any) { a.podChanged(ctx, obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				a.podRemoved(p)
			}
		},
	}); err != nil {
		return fmt.Errorf("pod informer: %w", err)
	}
	factory.Start(ctx.Done())
	cfg.Logf("node agent: node %s registered, pod subnet %s", cfg.NodeName, cfg.PodSubnet)
	<-ctx.Done()
	factory.Shutdown()

	// Stop every pod: the agent is going away and so must what it started.
	a.mu.Lock()
	for _, w := range a.workers {
		w.shutdown()
	}
	a.mu.Unlock()
	a.wg.Wait()
	return nil
}

func (a *Agent) registerNode(ctx context.Context) (*corev1.Node, error) {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name: a.cfg.NodeName,
			Labels: map[string]string{
				"kubernetes.io/hostname": a.cfg.NodeName,
				"kubernetes.io/os":       "linux",
				"kubernetes.io/arch":     runtime.GOARCH,
			},
		},
		Spec: corev1.NodeSpec{PodCIDR: a.net.subnet.String(), PodCIDRs: []string{a.net.subnet.String()}},
	}
	created, err := a.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		created, err = a.client.CoreV1().Nodes().Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
	}
	if err != nil {
		return nil, fmt.Errorf("register node %s: %w", a.cfg.NodeName, err)
	}
	if err := a.updateNodeStatus(ctx); err != nil {
		return nil, err
	}
	return created, nil
}

// updateNodeStatus posts the node's conditions, capacity and addresses,
// retrying on conflicts with the node controllers' own writes.
func (a *Agent) updateNodeStatus(ctx context.Context) error {
	return retry.RetryOnConflict(retry.DefaultBackoff, func() error { return a.updateNodeStatusOnce(ctx) })
}

func (a *Agent) updateNodeStatusOnce(ctx context.Context) error {
	node, err := a.client.CoreV1().Nodes().Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node: %w", err)
	}
	now := metav1.Now()
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		c := corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg, LastHeartbeatTime: now, LastTransitionTime: now}
		for _, old := range node.Status.Conditions {
			if old.Type == t && old.Status == s {
				c.LastTransitionTime = old.LastTransitionTime
			}
		}
		return c
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              resource.MustParse("8"),
		corev1.ResourceMemory:           resource.MustParse("32Gi"),
		corev1.ResourcePods:             resource.MustParse("110"),
		corev1.ResourceEphemeralStorage: resource.MustParse("100Gi"),
	}
	node.Status = corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity,
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "node agent reports no memory pressure"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "node agent reports no disk pressure"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "node agent reports sufficient PIDs"),
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubefill node agent is posting ready status"),
		},
		Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: a.net.gateway.String()},
			{Type: corev1.NodeHostName, Address: a.cfg.NodeName},
		},
		NodeInfo: corev1.NodeSystemInfo{
			KubeletVersion:          a.cfg.KubeletVersion,
			OperatingSystem:         "linux",
			Architecture:            runtime.GOARCH,
			ContainerRuntimeVersion: "kubefill-nodeagent://0.1.0",
		},
	}
	if _, err := a.client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) {
			return err
		}
		return fmt.Errorf("update node status: %w", err)
	}
	return nil
}

// heartbeat renews the node's Lease and refreshes its conditions, so that
// the node lifecycle controller keeps it Ready.
func (a *Agent) heartbeat(ctx context.Context, node *corev1.Node) {
	leases := a.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	lastStatus := time.Now()
	for {
		now := metav1.NewMicroTime(time.Now())
		lease, err := leases.Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = leases.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{
					Name:            a.cfg.NodeName,
					OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}},
				},
				Spec: coordinationv1.LeaseSpec{
					HolderIdentity:       ptr.To(a.cfg.NodeName),
					LeaseDurationSeconds: ptr.To(int32(leaseDuration / time.Second)),
					RenewTime:            &now,
				},
			}, metav1.CreateOptions{})
		case err == nil:
			lease.Spec.RenewTime = &now
			_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
		}
		if err != nil && ctx.Err() == nil {
			a.cfg.Logf("node agent: renew lease: %v", err)
		}
		if time.Since(lastStatus) >= nodeStatusInterval {
			if err := a.updateNodeStatus(ctx); err != nil && ctx.Err() == nil {
				a.cfg.Logf("node agent: %v", err)
			}
			lastStatus = time.Now()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(leaseRenewInterval):
		}
	}
}

// publishCSINode lists our CSI driver on the node, as the kubelet's plugin
// registration does; the scheduler requires it before it places pods that use
// the driver's volumes.
func (a *Agent) publishCSINode(ctx context.Context, node *corev1.Node) error {
	want := &storagev1.CSINode{
		ObjectMeta: metav1.ObjectMeta{
			Name:            a.cfg.NodeName,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}},
		},
		Spec: storagev1.CSINodeSpec{Drivers: []storagev1.CSINodeDriver{{Name: a.cfg.DriverName, NodeID: a.cfg.NodeName}}},
	}
	_, err := a.client.StorageV1().CSINodes().Create(ctx, want, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cur, gerr := a.client.StorageV1().CSINodes().Get(ctx, a.cfg.NodeName, metav1.GetOptions{})
		if gerr != nil {
			return fmt.Errorf("get CSINode: %w", gerr)
		}
		cur.Spec = want.Spec
		_, err = a.client.StorageV1().CSINodes().Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("publish CSINode: %w", err)
	}
	return nil
}

func (a *Agent) podChanged(ctx context.Context, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	w, ok := a.workers[pod.UID]
	if !ok {
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			if pod.DeletionTimestamp != nil {
				// A finished pod this agent no longer runs: confirm deletion.
				go a.finalDelete(ctx, pod)
			}
			return
		}
		w = newPodWorker(a, pod)
		a.workers[pod.UID] = w
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			w.run(ctx)
			a.mu.Lock()
			delete(a.workers, pod.UID)
			a.mu.Unlock()
		}()
	}
	w.update(pod)
}

func (a *Agent) podRemoved(pod *corev1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if w, ok := a.workers[pod.UID]; ok {
		w.removed()
	}
}

// finalDelete removes a terminated pod's object, as the kubelet does once
// its containers are gone (grace period zero, guarded by the pod's uid).
func (a *Agent) finalDelete(ctx context.Context, pod *corev1.Pod) {
	err := a.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: ptr.To(int64(0)),
		Preconditions:      &metav1.Preconditions{UID: &pod.UID},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) && ctx.Err() == nil {
		a.cfg.Logf("node agent: delete pod %s/%s: %v", pod.Namespace, pod.Name, err)
	}
}

func (a *Agent) podDir(uid types.UID) string {
	return filepath.Join(a.cfg.Dir, "pods", string(uid))
}

// errPodGone ends a worker whose pod object was deleted.
var errPodGone = errors.New("pod deleted")
