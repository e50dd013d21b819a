package main

import (
	"bytes"
	"strings"
	"testing"
)

// Flag mistakes are reported before any connection to a cluster is tried.
func TestUploadCommandRejectsBadFlags(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no args", nil, "accepts 2 arg(s)"},
		{"unknown kind", []string{"vm", "disk", "--image-path=d.img", "--size=1Gi"}, "unknown kind \"vm\""},
		{"no file", []string{"dv", "disk", "--size=1Gi"}, "--image-path"},
		{"image and archive", []string{"dv", "disk", "--image-path=a", "--archive-path=b", "--size=1Gi"}, "exclude each other"},
		{"no size", []string{"pvc", "disk", "--image-path=a"}, "--size is required"},
		{"archive on block", []string{"dv", "disk", "--archive-path=a.tar", "--size=1Gi", "--volume-mode=block"}, "Filesystem volume"},
		{"plain http proxy", []string{"dv", "disk", "--image-path=a", "--size=1Gi", "--uploadproxy-url=http://x"}, "must be https"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cmd := newUploadCommand()
			cmd.SetArgs(tc.args)
			cmd.SilenceErrors, cmd.SilenceUsage = true, true
			cmd.SetOut(&bytes.Buffer{})
			err := cmd.Execute()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

func TestUploadCommandHelp(t *testing.T) {
	cmd := newUploadCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"kubefill upload dv fedora --size=10Gi --image-path=", "--archive-path", "--uploadproxy-url", "--no-create", "--force-bind", "--wait-secs", "--retry", "--insecure", "--ca-cert", "--kubeconfig", "--storage-class", "--access-mode", "--volume-mode"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--help lacks %q", want)
		}
	}
	if d := cmd.Flags().Lookup("wait-secs").DefValue; d != "300" {
		t.Errorf("--wait-secs default %s, want 300", d)
	}
}

func TestUploadProxyCommandRejectsBadFlags(t *testing.T) {
	for args, want := range map[string]string{
		"--secure-port=0":                                  "not a TCP port",
		"--upload-server-address=dns":                      "--upload-server-address must be",
		"--tls-cert-file=/tmp/x":                           "go together",
		"--client-cert-file=/tmp/c":                        "--signing-key-dir is required",
		"--signing-key-dir=/tmp/k --pod-ready-timeout=-1s": "are required",
	} {
		cmd := newUploadProxyCommand()
		cmd.SetArgs(strings.Fields(args))
		cmd.SilenceErrors, cmd.SilenceUsage = true, true
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want one mentioning %q", args, err, want)
		}
	}
}
