// Command coredns is the local cluster's DNS: CoreDNS with only the plugins a node needs to resolve Services and
// pods (bind, health, errors, cache, kubernetes), so that it builds in a fraction of the time the full distribution takes
// and answers nothing outside cluster.local (it has no forward plugin: no query leaves the node).
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

func init() {
	// The order in which plugins see a query: the same relative order as CoreDNS's own plugin.cfg.
	dnsserver.Directives = []string{"bind", "health", "errors", "cache", "kubernetes"}
}

func main() { coremain.Run() }
