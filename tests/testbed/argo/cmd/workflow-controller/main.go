// Command workflow-controller runs Argo Workflows' workflow controller (the version in
// ../../go.mod) for the trainflow test bed, with its one server bound to a loopback address.
//
// The upstream binary (github.com/argoproj/argo-workflows/v3/cmd/workflow-controller) always
// serves /healthz and pprof on ":6060" (every interface) and has no flag to change that. This
// wrapper builds the same controller from the package upstream exports
// (workflow/controller.NewWorkflowController, then Run) and differs only in what the test bed
// needs:
//
//   - /healthz is served on --healthz-address, which must be a loopback IP and port (127.0.0.0/8
//     or ::1); there is no pprof;
//   - no leader election (one controller per test bed) and no Prometheus server: the controller's
//     configmap must say metricsConfig.enabled: false (tests/support/kfp_backend.py writes it), and
//     this wrapper never starts the metrics server even if it does not;
//   - the workflow namespace is --namespace (and --managed-namespace for a namespaced install).
//
// Usage:
//
//	workflow-controller --kubeconfig=PATH --namespace=NS --configmap=NAME
//	    --executor-image=IMAGE [--executor-image-pull-policy=IfNotPresent]
//	    --healthz-address=127.0.0.1:PORT [--workflow-workers=N] [--loglevel=info] [--gloglevel=0]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	log "github.com/sirupsen/logrus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	wfclientset "github.com/argoproj/argo-workflows/v3/pkg/client/clientset/versioned"
	cmdutil "github.com/argoproj/argo-workflows/v3/util/cmd"
	"github.com/argoproj/argo-workflows/v3/workflow/controller"
)

// loopbackAddress returns addr if it is HOST:PORT with a loopback IP host, else an error.
func loopbackAddress(addr string) (string, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--healthz-address %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return "", fmt.Errorf("--healthz-address %q: the host must be a loopback IP (127.0.0.0/8 or ::1)", addr)
	}
	return addr, nil
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the cluster (required)")
	namespace := flag.String("namespace", "", "namespace the controller lives in: its configmap is read there (required)")
	managedNamespace := flag.String("managed-namespace", "", "watch workflows in this namespace only (empty: all)")
	configMap := flag.String("configmap", "workflow-controller-configmap", "name of the controller's configmap")
	executorImage := flag.String("executor-image", "", "argoexec image for the wait/init containers (required)")
	executorPullPolicy := flag.String("executor-image-pull-policy", "IfNotPresent", "imagePullPolicy of the executor containers")
	healthzAddress := flag.String("healthz-address", "", "loopback HOST:PORT for /healthz (required)")
	workflowWorkers := flag.Int("workflow-workers", 4, "workflow workers")
	podCleanupWorkers := flag.Int("pod-cleanup-workers", 2, "pod clean-up workers")
	logLevel := flag.String("loglevel", "info", "debug|info|warn|error")
	glogLevel := flag.Int("gloglevel", 0, "klog verbosity, also passed to the executor (--gloglevel)")
	flag.Parse()
	// Registers klog's flags and sets -v: the controller passes that value to every argoexec
	// container as --gloglevel (workflow/controller/workflowpod.go), which rejects an empty one.
	cmdutil.SetGLogLevel(*glogLevel)

	if err := run(*kubeconfig, *namespace, *managedNamespace, *configMap, *executorImage,
		*executorPullPolicy, *healthzAddress, *workflowWorkers, *podCleanupWorkers, *logLevel); err != nil {
		fmt.Fprintln(os.Stderr, "workflow-controller:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, namespace, managedNamespace, configMap, executorImage, executorPullPolicy,
	healthzAddress string, workflowWorkers, podCleanupWorkers int, logLevel string) error {
	if kubeconfig == "" || namespace == "" || executorImage == "" || healthzAddress == "" {
		return errors.New("--kubeconfig, --namespace, --executor-image and --healthz-address are required")
	}
	addr, err := loopbackAddress(healthzAddress)
	if err != nil {
		return err
	}
	level, err := log.ParseLevel(logLevel)
	if err != nil {
		return fmt.Errorf("--loglevel: %w", err)
	}
	log.SetLevel(level)

	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	restConfig.QPS, restConfig.Burst = 20, 30
	kubeClient, err := kubernetes.NewForConfig(restConfig)
	if err != nil {
		return err
	}
	wfClient, err := wfclientset.NewForConfig(restConfig)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	wfc, err := controller.NewWorkflowController(ctx, restConfig, kubeClient, wfClient, namespace,
		managedNamespace, executorImage, executorPullPolicy, "text", configMap, false)
	if err != nil {
		return fmt.Errorf("creating the controller: %w", err)
	}

	listener, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", wfc.Healthz)
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := server.Serve(listener); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.WithError(err).Error("healthz server stopped")
		}
	}()

	// Run's arguments: workflow, TTL, pod clean-up, cron-workflow and archive workers.
	go wfc.Run(ctx, workflowWorkers, 1, podCleanupWorkers, 1, 1)
	<-ctx.Done()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return server.Shutdown(shutdownCtx)
}
