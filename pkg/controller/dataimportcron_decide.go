package controller

import (
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/storage"
)

// The pure decisions of the DataImportCron controller: names, the digested
// source URL, what garbage collection removes, and the conditions.

const (
	digestSHA256Prefix = "sha256:"
	digestUIDPrefix    = "uid:"
	// importNameDigestChars of the digest name each import, as in CDI.
	importNameDigestChars = 12
	// cronJobUIDChars of the cron's UID name its CronJob, as in CDI.
	cronJobUIDChars = 8
	// DefaultImportsToKeep is how many imports a cron keeps without importsToKeep.
	DefaultImportsToKeep = 3
	// maxCronJobName: a CronJob's name leaves room for the 11 characters its
	// controller appends to name each Job (the API server refuses longer).
	maxCronJobName = 52
	// maxJobName: a Job's name is also its pods' job-name label value.
	maxJobName = 63
	// maxObjectName is a DNS-1123 subdomain's length, CDI's name limit.
	maxObjectName = 253
)

// shortName is base-suffix, shortened past max as CDI's names are
// (openshift's naming.GetName): the base is cut and a hash of the whole name
// keeps names apart.
func shortName(base, suffix string, max int) string {
	name := base + "-" + suffix
	if len(name) <= max {
		return name
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(base))
	sum := fmt.Sprintf("%08x", h.Sum32())
	keep := max - len(suffix) - len(sum) - 2
	if keep < 0 {
		h := fnv.New32a()
		_, _ = h.Write([]byte(name))
		out := base[:min(len(base), max-9)] + "-" + fmt.Sprintf("%08x", h.Sum32())
		return out[:min(max, len(out))]
	}
	return strings.TrimRight(base[:keep], "-.") + "-" + sum + "-" + suffix
}

// ImportName is the name of the DataVolume, claim and snapshot of one
// import: <managedDataSource>-<12 characters of the digest after "sha256:"
// or "uid:">.
func ImportName(managedDataSource, digest string) (string, error) {
	var rest string
	switch {
	case strings.HasPrefix(digest, digestSHA256Prefix):
		rest = digest[len(digestSHA256Prefix):]
	case strings.HasPrefix(digest, digestUIDPrefix):
		rest = digest[len(digestUIDPrefix):]
	default:
		return "", fmt.Errorf("digest %q has no supported prefix (sha256: or uid:)", digest)
	}
	if len(rest) < importNameDigestChars {
		return "", fmt.Errorf("digest %q is too short", digest)
	}
	return shortName(managedDataSource, rest[:importNameDigestChars], maxObjectName), nil
}

// CronJobName is the poller's CronJob of a cron: <cron>-<first 8 characters
// of its UID>, shortened with a hash past 52 characters.
func CronJobName(cron *cdiv1.DataImportCron) string {
	uid := string(cron.UID)
	return shortName(cron.Name, uid[:min(len(uid), cronJobUIDChars)], maxCronJobName)
}

// InitialJobName is the poller Job run once when the CronJob is made.
func InitialJobName(cron *cdiv1.DataImportCron) string {
	return shortName("initial-job", CronJobName(cron), maxJobName)
}

// DigestedURL pins a registry URL to digest: docker://registry/repo[:tag]
// becomes docker://registry/repo@digest. A URL that already pins a digest
// keeps one (CDI issue #2689 doubled it).
func DigestedURL(url, digest string) string {
	scheme, ref, ok := strings.Cut(url, "://")
	if !ok {
		scheme, ref = "docker", url
	}
	if at := strings.Index(ref, "@"); at >= 0 {
		ref = ref[:at]
	}
	slash := strings.LastIndex(ref, "/")
	if colon := strings.LastIndex(ref, ":"); colon > slash {
		ref = ref[:colon]
	}
	return scheme + "://" + ref + "@" + digest
}

// ImportsToKeep is the cron's importsToKeep, default 3.
func ImportsToKeep(cron *cdiv1.DataImportCron) int {
	if n := cron.Spec.ImportsToKeep; n != nil && *n >= 0 {
		return int(*n)
	}
	return DefaultImportsToKeep
}

// CollectsGarbage says whether a cron removes outdated imports.
func CollectsGarbage(cron *cdiv1.DataImportCron) bool {
	gc := cron.Spec.GarbageCollect
	return gc == nil || *gc == cdiv1.DataImportCronGarbageCollectOutdated
}

// lastUse is an object's cdi.kubevirt.io/storage.import.lastUseTime; an
// absent or unreadable one counts as oldest.
func lastUse(o metav1.Object) time.Time {
	t, err := time.Parse(time.RFC3339Nano, o.GetAnnotations()[cdiv1.AnnLastUseTime])
	if err != nil {
		return time.Time{}
	}
	return t
}

// Outdated returns the imports past the keep newest by last use (newest
// first, ties by name), the ones garbage collection removes. Times are
// compared as times, not strings: RFC3339Nano drops trailing zeros.
func Outdated[T metav1.Object](items []T, keep int) []T {
	if len(items) <= keep {
		return nil
	}
	sorted := append([]T(nil), items...)
	sort.SliceStable(sorted, func(i, j int) bool {
		a, b := lastUse(sorted[i]), lastUse(sorted[j])
		if !a.Equal(b) {
			return a.After(b)
		}
		return sorted[i].GetName() < sorted[j].GetName()
	})
	return sorted[keep:]
}

// TemplateStorageClass is the class the template names, or "".
func TemplateStorageClass(dv *cdiv1.DataVolume) string {
	switch {
	case dv.Spec.PVC != nil && dv.Spec.PVC.StorageClassName != nil:
		return *dv.Spec.PVC.StorageClassName
	case dv.Spec.Storage != nil && dv.Spec.Storage.StorageClassName != nil:
		return *dv.Spec.Storage.StorageClassName
	}
	return ""
}

// EffectiveStorageClass is the class a cron's imports land on: the
// template's, else the virtualization default, else the cluster default;
// "" when there is none.
func EffectiveStorageClass(template *cdiv1.DataVolume, classes []storagev1.StorageClass) string {
	if name := TemplateStorageClass(template); name != "" {
		return name
	}
	return storage.DataVolumeClassName(classes)
}

// cronCondition is one condition the cron should show.
type cronCondition struct {
	Status          corev1.ConditionStatus
	Reason, Message string
}

// Condition reasons of a DataImportCron, CDI's.
const (
	ReasonNoDigest          = "NoDigest"
	ReasonNoImport          = "NoImport"
	ReasonOutdated          = "Outdated"
	ReasonImportScheduled   = "ImportScheduled"
	ReasonImportProgressing = "ImportProgressing"
	ReasonUpToDate          = "UpToDate"
)

// importState is what a reconcile found of the current import.
type importState struct {
	// DVPhase is the current import's DataVolume phase, "" without one.
	DVPhase cdiv1.DataVolumePhase
	// Succeeded: the DataVolume succeeded, or its claim is bound without
	// one, or its snapshot exists.
	Succeeded bool
	// Importing: the cron has a current import.
	Importing bool
	// DigestUpdated: the desired digest differs from the current import's.
	DigestUpdated bool
	Format        cdiv1.DataImportCronSourceFormat
	// Snapshot: a snapshot of the import exists (snapshot format), and
	// SnapshotReady whether it is ready to use.
	Snapshot, SnapshotReady bool
}

// progressingCondition is the Progressing condition of a state.
func progressingCondition(s importState) cronCondition {
	if s.Succeeded || s.DVPhase == "" || s.DVPhase == cdiv1.Succeeded {
		return cronCondition{corev1.ConditionFalse, ReasonNoImport, "No current import"}
	}
	switch s.DVPhase {
	case cdiv1.ImportScheduled:
		return cronCondition{corev1.ConditionFalse, ReasonImportScheduled, "Import is scheduled"}
	case cdiv1.ImportInProgress:
		return cronCondition{corev1.ConditionTrue, ReasonImportProgressing, "Import is progressing"}
	}
	return cronCondition{corev1.ConditionFalse, string(s.DVPhase), "Import DataVolume phase " + string(s.DVPhase)}
}

// notAuthorizedCondition is the Progressing condition of a cron whose
// ServiceAccount may not clone its source: CDI's reason and message, then
// why (the refusal names the ServiceAccount and the missing permission).
func notAuthorizedCondition(refusal string) cronCondition {
	return cronCondition{corev1.ConditionFalse, ReasonNotAuthorized, "Not authorized to create DataVolume: " + refusal}
}

// upToDateCondition is the UpToDate condition of a state; ok is false when
// it stays as it is (a snapshot import whose snapshot is not made yet).
func upToDateCondition(s importState) (c cronCondition, ok bool) {
	switch {
	case s.DigestUpdated:
		return cronCondition{corev1.ConditionFalse, ReasonOutdated, "Source digest updated since last import"}, true
	case s.Succeeded && s.Format == cdiv1.DataImportCronSourceFormatSnapshot:
		if !s.Snapshot {
			return cronCondition{}, false
		}
		if !s.SnapshotReady {
			return cronCondition{corev1.ConditionFalse, ReasonImportProgressing, "Snapshot of imported data is progressing"}, true
		}
		return cronCondition{corev1.ConditionTrue, ReasonUpToDate, "Latest import is up to date"}, true
	case s.Succeeded:
		return cronCondition{corev1.ConditionTrue, ReasonUpToDate, "Latest import is up to date"}, true
	case s.Importing:
		return cronCondition{corev1.ConditionFalse, ReasonImportProgressing, "Import is progressing"}, true
	}
	return cronCondition{corev1.ConditionFalse, ReasonNoDigest, "No source digest"}, true
}

// setCronCondition writes c into the cron's conditions as CDI does: the
// transition time moves only with the status, the heartbeat with any change.
func setCronCondition(cron *cdiv1.DataImportCron, typ cdiv1.DataImportCronConditionType, c cronCondition, now metav1.Time) {
	for i := range cron.Status.Conditions {
		cur := &cron.Status.Conditions[i]
		if cur.Type != typ {
			continue
		}
		if cur.Status == c.Status && cur.Reason == c.Reason && cur.Message == c.Message {
			return
		}
		if cur.Status != c.Status {
			cur.Status = c.Status
			cur.LastTransitionTime = now
		}
		cur.LastHeartbeatTime, cur.Reason, cur.Message = now, c.Reason, c.Message
		return
	}
	cron.Status.Conditions = append(cron.Status.Conditions, cdiv1.DataImportCronCondition{Type: typ, ConditionState: cdiv1.ConditionState{
		Status: c.Status, Reason: c.Reason, Message: c.Message, LastTransitionTime: now, LastHeartbeatTime: now}})
}

// cronCondition returns the cron's condition of typ, or nil.
func findCronCondition(cron *cdiv1.DataImportCron, typ cdiv1.DataImportCronConditionType) *cdiv1.DataImportCronCondition {
	for i := range cron.Status.Conditions {
		if cron.Status.Conditions[i].Type == typ {
			return &cron.Status.Conditions[i]
		}
	}
	return nil
}

// instancetypeLabels are the cron labels its imports carry, as CDI copies them.
var instancetypeLabels = []string{
	cdiv1.LabelDefaultInstancetype, cdiv1.LabelDefaultInstancetypeKind,
	cdiv1.LabelDefaultPreference, cdiv1.LabelDefaultPreferenceKind,
	cdiv1.LabelDynamicCredentialSupport,
}

// cronResourceLabels are the labels of every object a cron creates.
func cronResourceLabels(cron *cdiv1.DataImportCron) map[string]string {
	l := map[string]string{
		cdiv1.LabelDataImportCron: cron.Name,
		cdiv1.LabelAppComponent:   "storage",
		cdiv1.LabelAppManagedBy:   "kubefill",
	}
	if p := cron.Spec.RetentionPolicy; p != nil && *p == cdiv1.DataImportCronRetainNone {
		l[cdiv1.LabelDataImportCronCleanup] = "true"
	}
	return l
}

// ImportDataVolume renders the DataVolume of an import: a copy of the
// template in the cron's namespace, its registry URL pinned to the digest,
// with CDI's labels and annotations.
func ImportDataVolume(cron *cdiv1.DataImportCron, name, digest string, now time.Time) *cdiv1.DataVolume {
	dv := cron.Spec.Template.DeepCopy()
	dv.ObjectMeta = metav1.ObjectMeta{
		Name: name, Namespace: cron.Namespace,
		Labels: dv.Labels, Annotations: dv.Annotations,
	}
	dv.Status = cdiv1.DataVolumeStatus{}
	if src := dv.Spec.Source; src != nil && src.Registry != nil && src.Registry.URL != nil && strings.HasPrefix(digest, digestSHA256Prefix) {
		u := DigestedURL(*src.Registry.URL, digest)
		src.Registry.URL = &u
	}
	if dv.Labels == nil {
		dv.Labels = map[string]string{}
	}
	for k, v := range cronResourceLabels(cron) {
		dv.Labels[k] = v
	}
	for _, k := range instancetypeLabels {
		if v := cron.Labels[k]; v != "" {
			dv.Labels[k] = v
		}
	}
	if dv.Annotations == nil {
		dv.Annotations = map[string]string{}
	}
	dv.Annotations[cdiv1.AnnImmediateBinding] = "true"
	dv.Annotations[cdiv1.AnnLastUseTime] = now.UTC().Format(time.RFC3339Nano)
	if v := cron.Annotations[cdiv1.AnnPodRetainAfterCompletion]; v != "" {
		dv.Annotations[cdiv1.AnnPodRetainAfterCompletion] = v
	}
	return dv
}

// dataSourceSourceFor is where the managed DataSource points for the last
// import in a format.
func dataSourceSourceFor(format cdiv1.DataImportCronSourceFormat, last *cdiv1.DataVolumeSourcePVC) *cdiv1.DataSourceSource {
	if last == nil {
		return nil
	}
	if format == cdiv1.DataImportCronSourceFormatSnapshot {
		return &cdiv1.DataSourceSource{Snapshot: &cdiv1.DataVolumeSourceSnapshot{Namespace: last.Namespace, Name: last.Name}}
	}
	return &cdiv1.DataSourceSource{PVC: &cdiv1.DataVolumeSourcePVC{Namespace: last.Namespace, Name: last.Name}}
}

// erroneous says whether an import's DataVolume failed in a way a new
// digest replaces: Running False with reason Error or ImagePullFailed.
func erroneous(dv *cdiv1.DataVolume) bool {
	for _, c := range dv.Status.Conditions {
		if c.Type == cdiv1.DataVolumeRunning && c.Status == corev1.ConditionFalse &&
			(c.Reason == cdiv1.ReasonError || c.Reason == "ImagePullFailed") {
			return true
		}
	}
	return dv.Status.Phase == cdiv1.Failed
}
