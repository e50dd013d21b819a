package nodeagent

import (
	"net/netip"
	"strings"
	"testing"
)

func TestPodNetworkAddresses(t *testing.T) {
	if _, err := newPodNetwork("kfab12", "8.8.8.0/24"); err == nil {
		t.Error("a public pod subnet was accepted")
	}
	if _, err := newPodNetwork("toolongprefix", "10.244.1.0/24"); err == nil {
		t.Error("a link prefix longer than 6 characters was accepted")
	}
	n, err := newPodNetwork("kfab12", "10.244.7.0/28")
	if err != nil {
		t.Fatal(err)
	}
	if n.gateway != netip.MustParseAddr("10.244.7.1") {
		t.Fatalf("gateway = %s", n.gateway)
	}
	// A /28 has 16 addresses: network, gateway and broadcast leave 13.
	var got []netip.Addr
	for i := 0; i < 13; i++ {
		a, err := n.allocate("pod")
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		got = append(got, a)
	}
	if got[0] != netip.MustParseAddr("10.244.7.2") || got[12] != netip.MustParseAddr("10.244.7.14") {
		t.Fatalf("allocated %s .. %s, want 10.244.7.2 .. 10.244.7.14", got[0], got[12])
	}
	if _, err := n.allocate("one too many"); err == nil {
		t.Fatal("allocated past the end of the subnet")
	}
	n.release(got[4])
	if a, err := n.allocate("again"); err != nil || a != got[4] {
		t.Fatalf("after release got %s, %v; want %s", a, err, got[4])
	}
	name := n.names("18222c4a-1ce7-427a-8301-a75f49e7ae10")
	if name != "kfab1218222c4a" || len(name) > 15 || !strings.HasPrefix(name, "kfab12") {
		t.Fatalf("names() = %q", name)
	}
}
