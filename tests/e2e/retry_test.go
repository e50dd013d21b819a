package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/pkg/datapath/testimg"
	"github.com/kubefill/kubefill/tests/cluster"
	"github.com/kubefill/kubefill/tests/kit"
)

// failedAttemptsBeforeServing is one more failure than the three retries
// an import once gave up after: the import must outlast it, as CDI's does.
const failedAttemptsBeforeServing = 4

// TestFailingImportKeepsRetrying: a source that answers 503 keeps the
// import retrying as CDI's importer restarts: the DataVolume stays
// ImportInProgress, its Running condition is False with reason Error and
// the last failure's message (what KubeVirt shows as DataVolumeError), its
// restartCount grows past the old bound of three, and once the source
// serves, the import ends Succeeded with the source's bytes.
func TestFailingImportKeepsRetrying(t *testing.T) {
	parallel(t)
	needRealNode(t)
	c := shared.c
	ns := newNamespace(t)
	dir := t.TempDir()
	img := rawImage(t, dir, 4<<20)
	want := testimg.FileSHA256(t, filepath.Join(dir, img))
	var serving atomic.Bool
	var refused atomic.Int32
	url := flakyServer(t, dir, &serving, &refused) + "/" + img

	if err := c.Create(context.Background(), httpDV(ns, "flaky", url, cluster.StorageClassImmediate)); err != nil {
		t.Fatal(err)
	}
	var errorSeen cdiv1.DataVolumeCondition
	dv, seen := kit.WaitDataVolume(t, c, ns, "flaky", 6*time.Minute, func(dv *cdiv1.DataVolume) bool {
		if dv.Status.Phase == cdiv1.Failed {
			return true
		}
		if r := runningCondition(dv); r.Status == corev1.ConditionFalse && r.Reason == cdiv1.ReasonError {
			errorSeen = r
		}
		return dv.Status.RestartCount >= failedAttemptsBeforeServing
	})
	t.Logf("after %d refused requests: phases %v; restartCount %d; last Running=False Error: %q", refused.Load(), seen, dv.Status.RestartCount, errorSeen.Message)
	if dv.Status.Phase == cdiv1.Failed {
		t.Fatalf("the import gave up on a transient failure: %s\nevents:\n%s", runningCondition(dv).Message, kit.Events(c, ns, "flaky"))
	}
	if dv.Status.Phase != cdiv1.ImportInProgress {
		t.Errorf("while it fails the DataVolume is %s, want ImportInProgress as CDI shows it", dv.Status.Phase)
	}
	if !strings.Contains(errorSeen.Message, "503") || !strings.Contains(errorSeen.Message, "retrying") {
		t.Errorf("the Running condition was never False/Error with the failure and its retry; last seen %q", errorSeen.Message)
	}
	if refused.Load() == 0 {
		t.Fatal("the source refused nothing: the test proves nothing")
	}

	serving.Store(true)
	dv, seen = kit.WaitDataVolumeTerminal(t, c, ns, "flaky", 7*time.Minute)
	t.Logf("once the source serves: phases %v; restartCount %d", seen, dv.Status.RestartCount)
	if dv.Status.Phase != cdiv1.Succeeded {
		t.Fatalf("the import ended %s once the source served: %s\nevents:\n%s", dv.Status.Phase, runningCondition(dv).Message, kit.Events(c, ns, "flaky"))
	}
	if dv.Status.RestartCount < failedAttemptsBeforeServing {
		t.Errorf("restartCount %d after %d failed attempts", dv.Status.RestartCount, failedAttemptsBeforeServing)
	}
	if got := claimSHA256(t, ns, "flaky", 4<<20); got != want {
		t.Errorf("the claim holds sha256 %s, the source is %s", got, want)
	}
}

// flakyServer serves dir on the node's address, answering 503 to every
// request until serving is set; refused counts the requests it refused.
func flakyServer(t *testing.T, dir string, serving *atomic.Bool, refused *atomic.Int32) string {
	t.Helper()
	gw, err := cl.GatewayAddress()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(gw, "0"))
	if err != nil {
		t.Fatal(err)
	}
	files := http.FileServer(http.Dir(dir))
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !serving.Load() {
			refused.Add(1)
			http.Error(w, fmt.Sprintf("%s is down for maintenance", r.URL.Path), http.StatusServiceUnavailable)
			return
		}
		files.ServeHTTP(w, r)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}
