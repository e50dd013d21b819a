package main

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestMain runs the program itself when asked, so the test can signal a real process.
func TestMain(m *testing.M) {
	if os.Getenv("PAUSE_TEST_RUN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

func TestExitsZeroOnSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "PAUSE_TEST_RUN=1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // let it install its handlers
		if err := cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("after %v: %v, want exit 0", sig, err)
			}
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			t.Fatalf("still running 5 s after %v", sig)
		}
	}
}

func TestReapsChildren(t *testing.T) {
	child := exec.Command("true")
	if err := child.Start(); err != nil {
		t.Skip("no true(1):", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		reap()
		// Once reaped, the child's pid is gone: Wait4 says ECHILD.
		var ws syscall.WaitStatus
		if _, err := syscall.Wait4(child.Process.Pid, &ws, syscall.WNOHANG, nil); err == syscall.ECHILD {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the exited child was never reaped")
}
