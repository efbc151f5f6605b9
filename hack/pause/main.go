// Command pause is the local node's pod sandbox: it holds a pod's namespaces open, reaps the zombies a pod's
// processes leave to it as PID 1, and exits on SIGINT or SIGTERM. No registry is reachable here, so the node cannot
// pull the usual pause image; hack/build-node.sh builds this one into an image of its own.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
