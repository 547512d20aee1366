// Command coredns is CoreDNS (github.com/coredns/coredns, the version kubeadm of the test bed's
// Kubernetes release deploys) with only the plugins the test bed's cluster DNS uses compiled in:
// kubernetes (serves cluster.local from Services and EndpointSlices), bind (listen on the node's
// address only), cache, errors, log, health and ready. Upstream's main (coredns.go) imports core/plugin, which compiles every plugin and the
// cloud SDKs behind route53, azure and clouddns; a main of its own with fewer plugin imports is
// CoreDNS's documented way to choose plugins at compile time. Flags and Corefile syntax are
// upstream's (coremain.Run).
//
// Usage: coredns -conf Corefile [-dns.port PORT]
package main

import (
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
