// Command pause is the local node's pod sandbox process (the image
// registry.k8s.io/pause:3.10.2, which cannot be pulled here). As PID 1 of
// the pod it holds the namespaces open, reaps the zombies of processes that
// share its PID namespace, and exits 0 on SIGTERM or SIGINT, as the
// upstream pause does. Built static (CGO_ENABLED=0) so the image needs no libc.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "-v" || os.Args[1] == "--version") {
		fmt.Println("pause (kubefill local node)")
		return
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child; signals coalesce, so one SIGCHLD may
// stand for several.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}
