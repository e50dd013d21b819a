package main

import (
	"strings"
	"testing"
)

// Flag mistakes are reported before any connection to a cluster is tried.
func TestAPIServerCommandRejectsBadFlags(t *testing.T) {
	cases := map[string][]string{
		"certificate without key": {"--tls-cert-file", "/tmp/tls.crt"},
		"key without certificate": {"--tls-private-key-file", "/tmp/tls.key"},
		"port out of range":       {"--secure-port", "70000"},
	}
	want := map[string]string{
		"certificate without key": "go together",
		"key without certificate": "go together",
		"port out of range":       "not a TCP port",
	}
	for name, args := range cases {
		t.Run(name, func(t *testing.T) {
			cmd := newAPIServerCommand()
			cmd.SetArgs(args)
			cmd.SilenceErrors, cmd.SilenceUsage = true, true
			err := cmd.Execute()
			if err == nil || !strings.Contains(err.Error(), want[name]) {
				t.Fatalf("error %v, want one mentioning %q", err, want[name])
			}
		})
	}
	flags := newAPIServerCommand().Flags()
	for _, f := range []string{"kubeconfig", "secure-port", "tls-cert-file", "tls-private-key-file", "install-namespace", "token-lifetime", "signing-key-secret", "controller-user", "webhook-client-names"} {
		if flags.Lookup(f) == nil {
			t.Errorf("flag --%s missing", f)
		}
	}
	if d := flags.Lookup("controller-user").DefValue; d != "" {
		t.Errorf("--controller-user default %q, want empty (derived from the install namespace)", d)
	}
	if d := flags.Lookup("token-lifetime").DefValue; d != "5m0s" {
		t.Errorf("--token-lifetime default %s, want 5m0s (CDI's)", d)
	}
	// Webhook caller authentication is opt-in: a CDI cluster's
	// kube-apiserver presents no client certificate to webhooks.
	if d := flags.Lookup("webhook-client-names").DefValue; d != "[]" {
		t.Errorf("--webhook-client-names default %s, want none (off)", d)
	}
}
