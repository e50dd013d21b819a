package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	cdiv1 "github.com/kubefill/kubefill-api/cdi/v1beta1"
	"github.com/kubefill/kubefill/tests/kit"
)

// progressSample is the DataVolume and its claim as seen at one moment,
// with the bytes handed to the upload by then.
type progressSample struct {
	phase       cdiv1.DataVolumePhase
	dv, claim   string
	sentPercent float64
}

var cdiPercent = regexp.MustCompile(`^[0-9]+\.[0-9]+%$`)

// parsePercent reads CDI's progress string; ok is false for "N/A" or empty.
func parsePercent(t *testing.T, s string) (float64, bool) {
	t.Helper()
	if s == "" || s == string(cdiv1.ProgressNotAvailable) {
		return 0, false
	}
	if !cdiPercent.MatchString(s) {
		t.Fatalf("progress %q is not CDI's percentage form", s)
	}
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	if err != nil {
		t.Fatal(err)
	}
	return v, true
}

// TestUploadProgress streams a raw image slowly straight to the upload pod
// and watches the DataVolume and its claim all along: 0.00% while the
// server waits, values strictly between 0 and 100 while the bytes arrive
// (never more than was sent, never going down) with the phase staying
// UploadReady, and Succeeded at 100.0% at the end, with the claim holding
// the bytes sent.
func TestUploadProgress(t *testing.T) {
	parallel(t)
	c, installNS := shared.c, shared.installNS
	ns := newNamespace(t)

	const size = 24 << 20
	payload := make([]byte, size)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	sum := sha256.Sum256(payload)
	want := hex.EncodeToString(sum[:])

	dv := kit.DataVolume(ns, "slow", kit.Upload(), kit.WithPVC(filesystemClaim("128Mi")))
	if err := c.Create(context.Background(), dv); err != nil {
		t.Fatal(err)
	}
	base, hc, phases := uploadTarget(t, c, installNS, ns, "slow")
	t.Logf("phases before the upload: %v", phases)

	// Waiting for an upload: 0.00%, not a guess.
	idle, _ := kit.WaitDataVolume(t, c, ns, "slow", 30*time.Second, func(dv *cdiv1.DataVolume) bool { return dv.Status.Progress != cdiv1.ProgressNotAvailable })
	if idle.Status.Phase != cdiv1.UploadReady || idle.Status.Progress != "0.00%" {
		t.Fatalf("before the upload: %s %s, want UploadReady 0.00%%", idle.Status.Phase, idle.Status.Progress)
	}

	// Watch the DataVolume and its claim until the DataVolume ends.
	var sent atomic.Int64
	samples := make(chan []progressSample, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	go func() {
		var out []progressSample
		defer func() { samples <- out }()
		for ctx.Err() == nil {
			got, pvc := &cdiv1.DataVolume{}, &corev1.PersistentVolumeClaim{}
			errDV := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "slow"}, got)
			errPVC := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: "slow"}, pvc)
			// Read after the Gets: whatever the server had received when
			// the controller last looked, the test had sent by now.
			s := progressSample{sentPercent: 100 * float64(sent.Load()) / size}
			if errDV == nil && errPVC == nil {
				s.phase, s.dv, s.claim = got.Status.Phase, string(got.Status.Progress), pvc.Annotations[cdiv1.AnnPopulatorProgress]
				if n := len(out); n == 0 || out[n-1].phase != s.phase || out[n-1].dv != s.dv || out[n-1].claim != s.claim {
					out = append(out, s)
				}
				if kit.Terminal(s.phase) {
					return
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()

	// 24 MiB in 512 KiB pieces, one every 250 ms: about 12 s, several of
	// the controller's 2 s looks.
	pr, pw := io.Pipe()
	go func() {
		const piece = 512 << 10
		for off := 0; off < size; off += piece {
			sent.Store(int64(off + piece)) // offered before written: the server never has more
			if _, err := pw.Write(payload[off : off+piece]); err != nil {
				pw.CloseWithError(err)
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
		pw.Close()
	}()
	took := mustUpload(t, hc, base+"/v1beta1/upload", pr, size)
	t.Logf("uploaded %d bytes in %s", size, took.Round(time.Millisecond))

	seen := <-samples
	var dvValues, claimValues []string
	for _, s := range seen {
		dvValues = append(dvValues, fmt.Sprintf("%s %s (%.1f%% sent)", s.phase, s.dv, s.sentPercent))
		claimValues = append(claimValues, s.claim)
	}
	t.Logf("DataVolume progress seen: %v", dvValues)
	t.Logf("claim %s seen: %v", cdiv1.AnnPopulatorProgress, claimValues)
	if len(seen) == 0 {
		t.Fatal("the DataVolume was never read")
	}
	if last := seen[len(seen)-1]; last.phase != cdiv1.Succeeded || last.dv != "100.0%" {
		t.Fatalf("DataVolume ended %s %s, want Succeeded 100.0%%\nevents:\n%s", last.phase, last.dv, eventsFor(ns, "slow"))
	}

	var lastDV, lastClaim float64
	midway, claimMidway := 0, 0
	for _, s := range seen {
		if s.phase != cdiv1.UploadReady && s.phase != cdiv1.Succeeded {
			t.Errorf("phase %s during the upload, want UploadReady until Succeeded", s.phase)
		}
		if v, ok := parsePercent(t, s.dv); ok {
			if v < lastDV {
				t.Errorf("DataVolume progress went down: %v", dvValues)
			}
			// FormatProgress rounds to 0.01.
			if v > s.sentPercent+0.01 && s.phase != cdiv1.Succeeded {
				t.Errorf("DataVolume progress %s with only %.2f%% sent", s.dv, s.sentPercent)
			}
			if v == 100 && s.phase != cdiv1.Succeeded {
				t.Errorf("100%% shown in phase %s", s.phase)
			}
			if v > 0 && v < 100 && s.phase == cdiv1.UploadReady {
				midway++
			}
			lastDV = v
		}
		if v, ok := parsePercent(t, s.claim); ok {
			if v < lastClaim {
				t.Errorf("claim progress went down: %v", claimValues)
			}
			if v > s.sentPercent+0.01 && s.phase != cdiv1.Succeeded {
				t.Errorf("claim progress %s with only %.2f%% sent", s.claim, s.sentPercent)
			}
			if v > 0 && v < 100 {
				claimMidway++
			}
			lastClaim = v
		}
	}
	if midway == 0 {
		t.Errorf("no DataVolume progress strictly between 0 and 100 while UploadReady: %v", dvValues)
	}
	if claimMidway == 0 {
		t.Errorf("no claim progress strictly between 0 and 100: %v", claimValues)
	}
	if got := claimSHA256(t, ns, "slow", size); got != want {
		t.Errorf("claim holds sha256 %s, sent %s", got, want)
	}
}
