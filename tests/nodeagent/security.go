package nodeagent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	corev1 "k8s.io/api/core/v1"
)

// identity is who a container's process runs as.
type identity struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
}

// containerIdentity resolves a container's user, group and supplementary
// groups from its and its pod's security contexts, as the kubelet does: the
// container's runAsUser/runAsGroup win over the pod's; with no user the
// image's (root here) applies; fsGroup and supplementalGroups become
// supplementary groups. runAsNonRoot refuses to run as uid 0.
func containerIdentity(pod *corev1.Pod, c *corev1.Container) (identity, error) {
	var id identity
	var nonRoot bool
	psc := pod.Spec.SecurityContext
	if psc != nil {
		if psc.RunAsUser != nil {
			id.UID = uint32(*psc.RunAsUser)
		}
		if psc.RunAsGroup != nil {
			id.GID = uint32(*psc.RunAsGroup)
		}
		if psc.RunAsNonRoot != nil {
			nonRoot = *psc.RunAsNonRoot
		}
		for _, g := range psc.SupplementalGroups {
			id.Groups = append(id.Groups, uint32(g))
		}
		if psc.FSGroup != nil {
			id.Groups = append(id.Groups, uint32(*psc.FSGroup))
		}
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			id.UID = uint32(*sc.RunAsUser)
		}
		if sc.RunAsGroup != nil {
			id.GID = uint32(*sc.RunAsGroup)
		}
		if sc.RunAsNonRoot != nil {
			nonRoot = *sc.RunAsNonRoot
		}
	}
	if nonRoot && id.UID == 0 {
		return identity{}, errors.New("container has runAsNonRoot and image will run as root")
	}
	sort.Slice(id.Groups, func(i, j int) bool { return id.Groups[i] < id.Groups[j] })
	id.Groups = dedupe(id.Groups)
	return id, nil
}

func dedupe(gs []uint32) []uint32 {
	var out []uint32
	for i, g := range gs {
		if i == 0 || g != gs[i-1] {
			out = append(out, g)
		}
	}
	return out
}

// applyFSGroup gives a volume's files to the pod's fsGroup the way the
// kubelet does for volumes whose driver allows it: group ownership,
// group read/write (read for read-only volumes), and setgid on directories
// so that new files inherit the group.
func applyFSGroup(root string, gid int64, readOnly bool) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if err := os.Lchown(p, -1, int(gid)); err != nil {
			return fmt.Errorf("chown %s to group %d: %w", p, gid, err)
		}
		mode := info.Mode()
		perm := mode.Perm() | 0o040
		if !readOnly {
			perm |= 0o020
		}
		if mode.IsDir() {
			perm |= 0o010
			return os.Chmod(p, perm|os.ModeSetgid)
		}
		if mode&0o100 != 0 {
			perm |= 0o010
		}
		return os.Chmod(p, perm)
	})
}
