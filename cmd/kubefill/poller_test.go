package main

import (
	"io"
	"strings"
	"testing"
)

// The controller renders CDI's poller command line; both spellings of a
// flag parse, and a missing one is named.
func TestPollerFlags(t *testing.T) {
	p, err := parsePollerFlags([]string{"-ns", "os-images", "-cron", "fedora", "-url", "docker://quay.io/containerdisks/fedora:40", "-certdir", "/certs"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if p.namespace != "os-images" || p.cron != "fedora" || p.url != "docker://quay.io/containerdisks/fedora:40" || p.cert != "/certs" {
		t.Fatalf("parsed %+v", p)
	}
	if p, err = parsePollerFlags([]string{"--ns=a", "--cron=b", "--url=docker://r/x"}, io.Discard); err != nil || p.namespace != "a" {
		t.Fatalf("double-dash flags: %+v %v", p, err)
	}
	for _, args := range [][]string{{"-ns", "a", "-cron", "b"}, {"-cron", "b", "-url", "docker://r/x"}, {"-ns", "a", "-cron", "b", "-url", "docker://r/x", "extra"}} {
		if _, err := parsePollerFlags(args, io.Discard); err == nil {
			t.Errorf("%q parsed", args)
		} else if !strings.Contains(err.Error(), "-url") && !strings.Contains(err.Error(), "-ns") && !strings.Contains(err.Error(), "extra") {
			t.Errorf("%q: error %q names nothing", args, err)
		}
	}
}
