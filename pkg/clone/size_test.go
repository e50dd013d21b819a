package clone

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestPlanSizelessFitsTheUsableSpaceCheck(t *testing.T) {
	for _, overhead := range []float64{0, 0.055, 0.06, 0.1, 0.333, 0.5, 0.999} {
		for _, size := range []int64{1, mib - 1, mib, 10*gi + 1, 10 * gi, 7*gi + 12345} {
			in := claimInput()
			in.SourceClaim.Claim = bound(claim("src", "1Mi", block, "slow"), resource.NewQuantity(size, resource.BinarySI).String())
			in.Target = claim("tgt", "", fs, "fast")
			in.FilesystemOverhead = overhead
			d, err := Plan(in)
			if err != nil {
				t.Fatalf("overhead %v, size %d: %v", overhead, size, err)
			}
			if usable := usableSpace(d.TargetSize.Value(), corev1.PersistentVolumeFilesystem, overhead); usable < size {
				t.Errorf("overhead %v, size %d: sized %d, which holds only %d", overhead, size, d.TargetSize.Value(), usable)
			}
		}
	}
}

func TestSizeWithOverhead(t *testing.T) {
	cases := []struct {
		size     int64
		overhead float64
		want     int64
	}{
		{10 * gi, 0, 10 * gi},
		{10 * gi, 0.055, 11362347344},
		{1, 0.5, 2 * mib},        // rounded up to a MiB first
		{mib + 1, 0.5, 4 * mib},  // two MiB, doubled
		{3 * mib, 0.25, 4 * mib}, // exact
		{3 * mib, 0.1, 3495254},  // ceil(3145728 / 0.9)
	}
	for _, c := range cases {
		got, err := SizeWithOverhead(c.size, c.overhead)
		if err != nil || got != c.want {
			t.Errorf("SizeWithOverhead(%d, %v) = %d, %v; want %d", c.size, c.overhead, got, err, c.want)
		}
	}
	for _, bad := range []float64{-0.1, 1, 2} {
		if _, err := SizeWithOverhead(gi, bad); err == nil {
			t.Errorf("SizeWithOverhead(_, %v) succeeded", bad)
		}
	}
}
