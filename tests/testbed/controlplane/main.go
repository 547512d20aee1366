// Command testbed is a multi-call binary holding the Kubernetes programs that the trainflow test
// bed runs as local processes: kube-apiserver, kube-scheduler, etcd and kubectl, and for the real
// node kubelet, kube-controller-manager and kube-proxy.
//
// Usage: testbed <program> [flags...], program one of the names in the switch below
// (or call it through a symlink named after the program).
//
// One binary instead of seven saves six link steps and compiles the packages the programs share
// (client-go, apiserver, grpc, otel) once. The programs are the upstream ones, unmodified: each
// subcommand hands its arguments to the upstream entry point (k8s.io/kubernetes/cmd/*/app,
// k8s.io/kubectl/pkg/cmd, go.etcd.io/etcd/server/v3/etcdmain), and the version reported is the
// release's own (set with -ldflags by tests/testbed/build.sh).
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	_ "time/tzdata" // as upstream's cmd/kube-apiserver: time zones without a system tzdata

	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json, as upstream
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

const usage = "usage: testbed <kube-apiserver|kube-scheduler|kube-controller-manager|kubelet|kube-proxy|etcd|kubectl> [flags...]"

func main() {
	name, args := filepath.Base(os.Args[0]), os.Args[1:]
	if name == "testbed" {
		if len(args) == 0 {
			fmt.Fprintln(os.Stderr, usage)
			os.Exit(2)
		}
		name, args = args[0], args[1:]
	}
	// Each upstream entry point reads os.Args itself: make it look like its own binary.
	os.Args = append([]string{name}, args...)
	switch name {
	case "kube-apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "kube-scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "kube-controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kubelet":
		os.Exit(cli.Run(kubelet.NewKubeletCommand(context.Background())))
	case "kube-proxy":
		os.Exit(cli.Run(proxy.NewProxyCommand()))
	case "etcd":
		etcdmain.Main(os.Args)
	case "kubectl":
		logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) //nolint:errcheck // as upstream
		if err := cli.RunNoErrOutput(kubectl.NewDefaultKubectlCommand()); err != nil {
			kubectlutil.CheckErr(err)
		}
	default:
		fmt.Fprintf(os.Stderr, "testbed: unknown program %q\n%s\n", name, usage)
		os.Exit(2)
	}
}
