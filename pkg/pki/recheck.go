package pki

import (
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// recheck is the throttle the file reloaders share: at most one re-read per
// interval (1 s if zero); a re-read that fails is logged and the previous
// contents kept. The caller holds its lock.
type recheck struct {
	last time.Time
}

func (c *recheck) due(interval time.Duration, reload func() (bool, error), failed, reloaded, key, value string) {
	if interval <= 0 {
		interval = time.Second
	}
	if time.Since(c.last) < interval {
		return
	}
	c.last = time.Now()
	changed, err := reload()
	switch {
	case err != nil:
		logf.Log.WithName("pki").Error(err, failed)
	case changed:
		logf.Log.WithName("pki").Info(reloaded, key, value)
	}
}
