package importer

import (
	"net/url"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/kubefill/kubefill/pkg/contract"
)

// internalPath is one of the worker's own locations and the words a user
// reads instead.
type internalPath struct {
	path, say string
}

// internalPaths lists the importer pod's locations, the most specific
// first: a scratch file, the image file, the block device, the volumes.
func internalPaths(p Paths) []internalPath {
	var out []internalPath
	add := func(path, say string) {
		if path != "" && path != "/" && path != "." {
			out = append(out, internalPath{filepath.Clean(path), say})
		}
	}
	add(p.DataPath, "the target image")
	add(p.BlockPath, "the target block device")
	add(filepath.Dir(p.DataPath), "the target volume")
	add(p.ScratchDir, "the scratch volume")
	add(p.TerminationLog, "the pod's termination log")
	// Longer paths first, so that a file is named before its directory.
	sort.SliceStable(out, func(i, j int) bool { return len(out[i].path) > len(out[j].path) })
	return out
}

// SourceName is how a failure names the source the user gave: the
// endpoint with any password removed.
func SourceName(cfg *Config) string {
	if cfg.Source == contract.SourceNone || cfg.Endpoint == "" {
		return ""
	}
	if u, err := url.Parse(cfg.Endpoint); err == nil && u.Scheme != "" {
		return u.Redacted()
	}
	return cfg.Endpoint
}

// FailureMessage is the text a failed import reports (the termination
// message the controller copies to the DataVolume). It names the source
// the user gave, and none of the pod's own paths: each is replaced by
// what it is ("the target volume", "the scratch volume"; a file in the
// scratch volume is "the downloaded copy of the image"). The source's own
// text is left as it is even where it looks like such a path. It is pure.
func FailureMessage(msg, source string, paths []internalPath) string {
	if source == "" {
		return scrubPaths(msg, paths)
	}
	parts := strings.Split(msg, source)
	for i := range parts {
		parts[i] = scrubPaths(parts[i], paths)
	}
	out := strings.Join(parts, source)
	if len(parts) == 1 {
		out = "importing " + source + ": " + out
	}
	return out
}

// pathBoundary: a path starts and ends at one of these (or the text's ends).
const pathBoundary = `\s'"(),:=`

func scrubPaths(s string, paths []internalPath) string {
	for _, ip := range paths {
		say := ip.say
		scratch := strings.HasSuffix(ip.say, "scratch volume")
		re := regexp.MustCompile(`(^|[` + pathBoundary + `])` + regexp.QuoteMeta(ip.path) + `(/[^` + pathBoundary + `]*)?($|[` + pathBoundary + `])`)
		// A match takes the boundary after it, so two paths one character
		// apart need a second pass; the words put in never match again.
		for range 4 {
			next := re.ReplaceAllStringFunc(s, func(m string) string {
				sub := re.FindStringSubmatch(m)
				word := say
				if sub[2] != "" && scratch {
					word = "the downloaded copy of the image"
				}
				return sub[1] + word + sub[3]
			})
			if next == s {
				break
			}
			s = next
		}
	}
	return s
}
