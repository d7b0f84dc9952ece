// Command pause is the pod sandbox process of the hcp-olm real-node test environment: it holds a
// pod's namespaces open and exits on SIGTERM or SIGINT. Our own (Kubernetes' pause is C and
// is not published as a Go module); it does not reap zombies, which only matters for pods that
// share their process namespace, and none of ours do.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM)
	<-c
}
