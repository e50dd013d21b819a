package v1beta1

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// Each case is a value and the exact JSON CDI puts on the wire for it.
func TestWireFormat(t *testing.T) {
	cases := []struct {
		name string
		v    any
		want string
	}{
		{"http source", DataVolumeSource{HTTP: &DataVolumeSourceHTTP{URL: "http://x/d.qcow2", SecretRef: "s", CertConfigMap: "c", ExtraHeaders: []string{"A: b"}, SecretExtraHeaders: []string{"h"}, Checksum: "sha256:00"}},
			`{"http":{"url":"http://x/d.qcow2","secretRef":"s","certConfigMap":"c","extraHeaders":["A: b"],"secretExtraHeaders":["h"],"checksum":"sha256:00"}}`},
		{"blank and upload are empty objects", DataVolumeSource{Blank: &DataVolumeBlankImage{}}, `{"blank":{}}`},
		{"registry", DataVolumeSourceRegistry{URL: ptr.To("docker://r/i:1"), PullMethod: ptr.To(RegistryPullNode), Platform: &PlatformOptions{Architecture: "arm64"}},
			`{"url":"docker://r/i:1","pullMethod":"node","platform":{"architecture":"arm64"}}`},
		{"imageio", DataVolumeSourceImageIO{URL: "u", DiskID: "d"}, `{"url":"u","diskId":"d"}`},
		{"vddk", DataVolumeSourceVDDK{InitImageURL: "i", BackingFile: "b"}, `{"backingFile":"b","initImageURL":"i"}`},
		{"status", DataVolumeStatus{ClaimName: "c", Phase: UploadReady, Progress: ProgressNotAvailable, RestartCount: 1},
			`{"claimName":"c","phase":"UploadReady","progress":"N/A","restartCount":1}`},
		{"import proxy keeps CDI's capitals", ImportProxy{HTTPProxy: ptr.To("p"), HTTPSProxy: ptr.To("q"), NoProxy: ptr.To("n"), TrustedCAProxy: ptr.To("t")},
			`{"HTTPProxy":"p","HTTPSProxy":"q","noProxy":"n","trustedCAProxy":"t"}`},
		{"cdi workload placement", CDISpec{Workloads: NodePlacement{NodeSelector: map[string]string{"a": "b"}}, CloneStrategyOverride: ptr.To(CloneStrategyCsiClone)},
			`{"infra":{},"workload":{"nodeSelector":{"a":"b"}},"customizeComponents":{},"cloneStrategyOverride":"csi-clone"}`},
		{"claim property set", ClaimPropertySet{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, VolumeMode: ptr.To(corev1.PersistentVolumeBlock)},
			`{"accessModes":["ReadWriteMany"],"volumeMode":"Block"}`},
		{"clone source", VolumeCloneSourceSpec{Source: corev1.TypedLocalObjectReference{Kind: "VolumeSnapshot", Name: "s", APIGroup: ptr.To("snapshot.storage.k8s.io")}},
			`{"source":{"apiGroup":"snapshot.storage.k8s.io","kind":"VolumeSnapshot","name":"s"}}`},
		{"cron spec", DataImportCronSpec{Schedule: "0 */12 * * *", GarbageCollect: ptr.To(DataImportCronGarbageCollectNever), ImportsToKeep: ptr.To[int32](0),
			ManagedDataSource: "fedora", RetentionPolicy: ptr.To(DataImportCronRetainNone), ServiceAccountName: ptr.To("golden-images")},
			`{"template":{"metadata":{},"spec":{},"status":{}},"schedule":"0 */12 * * *","garbageCollect":"Never","importsToKeep":0,"managedDataSource":"fedora","retentionPolicy":"None","serviceAccountName":"golden-images"}`},
		{"cron status keeps CDI's capitalised import keys", DataImportCronStatus{
			CurrentImports:  []ImportStatus{{DataVolumeName: "fedora-0123456789ab", Digest: "sha256:0123456789abcdef"}},
			LastImportedPVC: &DataVolumeSourcePVC{Namespace: "os", Name: "fedora-0123456789ab"},
			SourceFormat:    ptr.To(DataImportCronSourceFormatSnapshot),
			Conditions:      []DataImportCronCondition{{Type: DataImportCronUpToDate, ConditionState: ConditionState{Status: corev1.ConditionTrue, Reason: "UpToDate"}}},
		},
			`{"currentImports":[{"DataVolumeName":"fedora-0123456789ab","Digest":"sha256:0123456789abcdef"}],"lastImportedPVC":{"namespace":"os","name":"fedora-0123456789ab"},` +
				`"sourceFormat":"snapshot","conditions":[{"type":"UpToDate","status":"True","lastTransitionTime":null,"lastHeartbeatTime":null,"reason":"UpToDate"}]}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := json.Marshal(c.v)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != c.want {
				t.Errorf("\n got %s\nwant %s", got, c.want)
			}
		})
	}
}

// Every phase string is CDI's, spelled exactly.
func TestPhaseStrings(t *testing.T) {
	phases := []DataVolumePhase{Pending, PVCBound, ImportScheduled, ImportInProgress, CloneScheduled, CloneInProgress,
		SnapshotForSmartCloneInProgress, CloneFromSnapshotSourceInProgress, SmartClonePVCInProgress, CSICloneInProgress,
		ExpansionInProgress, NamespaceTransferInProgress, UploadScheduled, UploadReady, WaitForFirstConsumer,
		PendingPopulation, PrepClaimInProgress, RebindInProgress, Paused, Succeeded, Failed, Unknown}
	want := "Pending PVCBound ImportScheduled ImportInProgress CloneScheduled CloneInProgress " +
		"SnapshotForSmartCloneInProgress CloneFromSnapshotSourceInProgress SmartClonePVCInProgress CSICloneInProgress " +
		"ExpansionInProgress NamespaceTransferInProgress UploadScheduled UploadReady WaitForFirstConsumer " +
		"PendingPopulation PrepClaimInProgress RebindInProgress Paused Succeeded Failed Unknown"
	got := ""
	for i, p := range phases {
		if i > 0 {
			got += " "
		}
		got += string(p)
	}
	if got != want {
		t.Errorf("phases\n got %s\nwant %s", got, want)
	}
}

// The cron's enum values and condition types are CDI's, spelled exactly.
func TestDataImportCronStrings(t *testing.T) {
	got := []string{string(DataImportCronGarbageCollectOutdated), string(DataImportCronGarbageCollectNever),
		string(DataImportCronRetainNone), string(DataImportCronRetainAll),
		string(DataImportCronSourceFormatPvc), string(DataImportCronSourceFormatSnapshot),
		string(DataImportCronProgressing), string(DataImportCronUpToDate)}
	want := []string{"Outdated", "Never", "None", "All", "pvc", "snapshot", "Progressing", "UpToDate"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("value %d = %q, want %q", i, got[i], want[i])
		}
	}
}

// A cron without spec.serviceAccountName clones as the namespace's default
// ServiceAccount, as CDI's does.
func TestDataImportCronCloneServiceAccount(t *testing.T) {
	for _, c := range []struct {
		sa   *string
		want string
	}{{nil, "default"}, {ptr.To(""), "default"}, {ptr.To("golden-images"), "golden-images"}} {
		cron := &DataImportCron{Spec: DataImportCronSpec{ServiceAccountName: c.sa}}
		if got := cron.CloneServiceAccount(); got != c.want {
			t.Errorf("serviceAccountName %v: %q, want %q", c.sa, got, c.want)
		}
	}
}
