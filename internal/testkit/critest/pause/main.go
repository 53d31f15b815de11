// Command pause is the sandbox ("pause") image's only binary for the private containerd
// of the tests (internal/testkit/critest): it holds the pod's namespaces until told to stop.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
