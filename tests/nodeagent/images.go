// Package nodeagent is the local cluster's stand-in for a kubelet: it
// registers a Node and keeps its Lease, publishes the CSINode, and runs the
// pods the scheduler binds to it as local processes, each pod in its own
// network namespace and each container in its own mount namespace with a
// private root, its volumes mounted through the CSI driver's
// NodePublishVolume. It reports pod status and events like a kubelet.
//
// It is test infrastructure: the product binary never links it.
package nodeagent

import (
	"path"
	"strings"
)

// imageBinDir is where an image's executables appear inside a container.
const imageBinDir = "/.image/bin"

// Image is what an image reference runs as here: host executables that
// appear in the container under imageBinDir, and the image's entrypoint and
// default arguments.
type Image struct {
	// Binaries maps a name under imageBinDir to a host executable.
	Binaries map[string]string
	// Entrypoint and Cmd play the roles of an OCI image's ENTRYPOINT and CMD.
	Entrypoint []string
	Cmd        []string
}

// ImageTable resolves image references.
type ImageTable struct {
	// KubefillBinary is the kubefill binary built from this checkout; every
	// image whose repository name contains "kubefill" runs it.
	KubefillBinary string
}

// shellImages are images whose pods only need a POSIX shell and coreutils,
// which come from the host's /bin and /usr.
var shellImages = map[string]bool{
	"busybox": true, "alpine": true, "debian": true, "ubuntu": true,
	"e2e-test-images/busybox": true, "kubefill-test/shell": true,
}

// repository strips the registry, tag and digest from an image reference:
// "registry.k8s.io/e2e-test-images/busybox:1.36" -> "e2e-test-images/busybox".
func repository(ref string) string {
	if i := strings.Index(ref, "@"); i >= 0 {
		ref = ref[:i]
	}
	if i := strings.LastIndex(ref, ":"); i >= 0 && !strings.Contains(ref[i:], "/") {
		ref = ref[:i]
	}
	if i := strings.Index(ref, "/"); i >= 0 {
		first := ref[:i]
		if strings.ContainsAny(first, ".:") || first == "localhost" {
			ref = ref[i+1:]
		}
	}
	return strings.TrimPrefix(ref, "library/")
}

// Resolve maps an image reference to what runs, or reports that the image is
// unknown here (the pod then waits with ErrImagePull).
func (t ImageTable) Resolve(ref string) (Image, bool) {
	repo := repository(ref)
	switch {
	case strings.Contains(path.Base(repo), "kubefill") && !shellImages[repo]:
		if t.KubefillBinary == "" {
			return Image{}, false
		}
		return Image{
			Binaries:   map[string]string{"kubefill": t.KubefillBinary},
			Entrypoint: []string{imageBinDir + "/kubefill"},
		}, true
	case shellImages[repo]:
		return Image{Cmd: []string{"sh"}}, true
	}
	return Image{}, false
}
