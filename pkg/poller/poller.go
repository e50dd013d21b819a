package poller

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
)

// Job is one poll: which cron to update and where its image is.
type Job struct {
	Namespace, Cron string
	Registry        Registry
}

// AnnotationUpdate is what one poll writes on the cron: always the poll
// time, and the digest only when it differs from the desired one already
// recorded (nil then), as CDI's poller does.
func AnnotationUpdate(current map[string]string, digest string, now time.Time) map[string]*string {
	set := map[string]*string{cdiv1.AnnLastCronTime: ptrTo(now.UTC().Format(time.RFC3339))}
	if digest != "" && current[cdiv1.AnnSourceDesiredDigest] != digest {
		set[cdiv1.AnnSourceDesiredDigest] = ptrTo(digest)
	}
	return set
}

func ptrTo(s string) *string { return &s }

// dataImportCronMeta is the cron's metadata only: the poller reads and
// patches annotations, so it needs no more of the type than its kind.
func dataImportCronMeta(ns, name string) *metav1.PartialObjectMetadata {
	m := &metav1.PartialObjectMetadata{}
	m.SetGroupVersionKind(cdiv1.SchemeGroupVersion.WithKind("DataImportCron"))
	m.Namespace, m.Name = ns, name
	return m
}

// Run polls once: it reads the image's digest, then patches the cron's
// annotations. It returns the digest it read and whether it was new.
func Run(ctx context.Context, c client.Client, job Job, now func() time.Time, log logr.Logger) (string, bool, error) {
	digest, err := Digest(ctx, job.Registry)
	if err != nil {
		return "", false, err
	}
	log.Info("read the image digest", "url", job.Registry.URL, "digest", digest)
	cron := dataImportCronMeta(job.Namespace, job.Cron)
	if err := c.Get(ctx, types.NamespacedName{Namespace: job.Namespace, Name: job.Cron}, cron); err != nil {
		return digest, false, fmt.Errorf("reading DataImportCron %s/%s: %w", job.Namespace, job.Cron, err)
	}
	set := AnnotationUpdate(cron.Annotations, digest, now())
	_, updated := set[cdiv1.AnnSourceDesiredDigest]
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": set}})
	if err != nil {
		return digest, false, err
	}
	if err := c.Patch(ctx, cron, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return digest, false, fmt.Errorf("updating DataImportCron %s/%s: %w", job.Namespace, job.Cron, err)
	}
	if updated {
		log.Info("digest updated", "cron", job.Namespace+"/"+job.Cron, "digest", digest)
	} else {
		log.Info("no digest update", "cron", job.Namespace+"/"+job.Cron)
	}
	return digest, updated, nil
}
