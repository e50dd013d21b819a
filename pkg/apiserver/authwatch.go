package apiserver

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// WatchAuthConfig keeps src in step with kube-system/extension-apiserver-authentication
// until ctx ends. It returns once the first list has been seen (with src set
// if the ConfigMap exists and parses) or with an error if the cache cannot sync.
func WatchAuthConfig(ctx context.Context, kube kubernetes.Interface, src *AuthSource, syncTimeout time.Duration) error {
	return WatchAuthConfigMap(ctx, kube, AuthConfigMapNamespace, AuthConfigMapName, src, syncTimeout)
}

// WatchAuthConfigMap is WatchAuthConfig for a ConfigMap of the same format at
// namespace/name.
func WatchAuthConfigMap(ctx context.Context, kube kubernetes.Interface, namespace, name string, src *AuthSource, syncTimeout time.Duration) error {
	log := logf.FromContext(ctx).WithName("authn").WithValues("configmap", namespace+"/"+name)
	apply := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return
		}
		cfg, err := ParseAuthConfigMap(cm)
		if err != nil {
			// Keep the last good configuration: a broken ConfigMap must not
			// turn a working server into one that trusts nobody or anybody.
			log.Error(err, "ignoring unparsable authentication ConfigMap", "resourceVersion", cm.ResourceVersion)
			return
		}
		src.Set(cfg)
		log.Info("loaded authentication configuration", "resourceVersion", cm.ResourceVersion,
			"clientCA", cfg.ClientCA != nil, "requestHeaderCA", cfg.RequestHeaderCA != nil, "allowedNames", cfg.AllowedNames)
	}
	lw := cache.NewListWatchFromClient(kube.CoreV1().RESTClient(), "configmaps", namespace,
		fields.OneTermEqualSelector(metav1.ObjectNameField, name))
	_, ctrl := cache.NewInformerWithOptions(cache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &corev1.ConfigMap{},
		ResyncPeriod:  10 * time.Minute,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    apply,
			UpdateFunc: func(_, obj any) { apply(obj) },
			DeleteFunc: func(any) {
				src.Set(nil)
				log.Info("authentication ConfigMap deleted; rejecting all authenticated requests until it returns")
			},
		},
	})
	go ctrl.RunWithContext(ctx)
	waitCtx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	if !cache.WaitForCacheSync(waitCtx.Done(), ctrl.HasSynced) {
		return fmt.Errorf("reading %s/%s within %s: %w", namespace, name, syncTimeout, waitCtx.Err())
	}
	return nil
}
