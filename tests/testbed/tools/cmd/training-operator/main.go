// Command training-operator runs the Kubeflow training operator (v1 API) for the trainflow test
// bed with every server it opens bound to the loopback interface.
//
// The upstream binary (github.com/kubeflow/training-operator/cmd/training-operator.v1) builds its
// controller-runtime manager with a webhook server that has a port but no host, so the webhook
// listens on all interfaces, and it has no flag to change that. This wrapper assembles the same
// operator from the packages upstream exports and differs only where the test bed needs it to:
//
//   - the webhook server listens on 127.0.0.1 (Host is fixed, not a flag);
//   - --metrics-bind-address and --health-probe-bind-address must name a loopback IP
//     (127.0.0.0/8 or ::1) or, for metrics, be "0" (off); anything else is refused at start;
//   - only the PyTorchJob scheme is wired (reconciler from controllerv1.SupportedSchemeReconciler,
//     validating webhook from webhooks.SupportedSchemeWebhook), without gang scheduling;
//   - no leader election and no namespace restriction.
//
// What is kept from upstream's behaviour: the webhook serving certificate is handled by the
// operator's own rotator (pkg/cert: secret "training-operator-webhook-cert" in $MY_POD_NAMESPACE,
// files in /tmp/k8s-webhook-server/serving-certs); controllers and webhooks are registered only
// once the certificates are ready; /readyz fails until then and afterwards follows the webhook
// server's own started check; client requests share one token bucket (--kube-api-qps,
// --kube-api-burst). The flag names are upstream's, so the test bed passes the same command line
// to this binary and to the stock one (tests/support/k8s.py, TRAINFLOW_TRAINING_OPERATOR_BIN).
//
// Usage:
//
//	training-operator [--kubeconfig=PATH] [--enable-scheme=pytorchjob]
//	    [--metrics-bind-address=127.0.0.1:PORT|0] [--health-probe-bind-address=127.0.0.1:PORT]
//	    [--webhook-server-port=PORT] [--controller-threads=N] [--kube-api-qps=Q] [--kube-api-burst=B]
//	    [--zap-log-level=...]
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/util/flowcontrol"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	kubeflowv1 "github.com/kubeflow/training-operator/pkg/apis/kubeflow.org/v1"
	"github.com/kubeflow/training-operator/pkg/cert"
	controllerv1 "github.com/kubeflow/training-operator/pkg/controller.v1"
	"github.com/kubeflow/training-operator/pkg/controller.v1/common"
	"github.com/kubeflow/training-operator/pkg/webhooks"
)

// webhookHost is where the admission webhook server listens; the test bed's
// ValidatingWebhookConfiguration points the API server at https://127.0.0.1:<port>/.
const webhookHost = "127.0.0.1"

// Names the operator's certificate rotator works with: upstream's flag defaults and constant
// (cmd/training-operator.v1/main.go, v1.9.4). The test bed creates the (empty) Secret and does not
// create a webhook configuration of that name, so the rotator injects no CA anywhere.
const (
	webhookServiceName       = "training-operator"
	webhookSecretName        = "training-operator-webhook-cert"
	webhookConfigurationName = "validator.training-operator.kubeflow.org"
)

var log = ctrl.Log.WithName("trainflow-training-operator")

type options struct {
	metricsAddr       string
	probeAddr         string
	webhookPort       int
	controllerThreads int
	qps               float64
	burst             int
	zap               zap.Options
}

// schemeFlag accepts --enable-scheme as upstream spells it, but only for PyTorchJob.
type schemeFlag struct{}

func (schemeFlag) String() string { return strings.ToLower(kubeflowv1.PyTorchJobKind) }

func (schemeFlag) Set(v string) error {
	if !strings.EqualFold(v, kubeflowv1.PyTorchJobKind) {
		return fmt.Errorf("only %q is supported by the test bed's operator, got %q",
			strings.ToLower(kubeflowv1.PyTorchJobKind), v)
	}
	return nil
}

func parseFlags() options {
	o := options{zap: zap.Options{Development: true, StacktraceLevel: zapcore.DPanicLevel}}
	fs := flag.CommandLine
	fs.StringVar(&o.metricsAddr, "metrics-bind-address", "127.0.0.1:8080",
		"Metrics endpoint address: a loopback IP and a port, or 0 to turn metrics off.")
	fs.StringVar(&o.probeAddr, "health-probe-bind-address", "127.0.0.1:8081",
		"Health probe (/healthz, /readyz) address: a loopback IP and a port.")
	fs.IntVar(&o.webhookPort, "webhook-server-port", 9443, "Port of the admission webhook server (on "+webhookHost+").")
	fs.IntVar(&o.controllerThreads, "controller-threads", 1, "Concurrent reconciles of the PyTorchJob controller.")
	fs.Float64Var(&o.qps, "kube-api-qps", 20, "Requests per second to the API server (one token bucket for all clients).")
	fs.IntVar(&o.burst, "kube-api-burst", 30, "Burst size of that token bucket.")
	fs.Var(schemeFlag{}, "enable-scheme", "Accepted for the stock operator's command line; only pytorchjob.")
	o.zap.BindFlags(fs)
	flag.Parse()
	if flag.NArg() > 0 {
		fail(fmt.Errorf("unexpected arguments: %s", strings.Join(flag.Args(), " ")))
	}
	if err := checkLoopback("--metrics-bind-address", o.metricsAddr, true); err != nil {
		fail(err)
	}
	if err := checkLoopback("--health-probe-bind-address", o.probeAddr, false); err != nil {
		fail(err)
	}
	if o.webhookPort < 1 || o.webhookPort > 65535 {
		fail(fmt.Errorf("--webhook-server-port must be 1-65535, got %d", o.webhookPort))
	}
	if o.controllerThreads < 1 || o.qps <= 0 || o.burst < 1 {
		fail(errors.New("--controller-threads, --kube-api-qps and --kube-api-burst must be positive"))
	}
	return o
}

// checkLoopback refuses an address that would listen beyond the loopback interface.
func checkLoopback(name, addr string, offAllowed bool) error {
	if offAllowed && addr == "0" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s=%q: want HOST:PORT with a loopback IP: %w", name, addr, err)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%s=%q: the host must be a loopback IP such as 127.0.0.1 or ::1", name, addr)
	}
	return nil
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "training-operator: %v\n", err)
	os.Exit(2)
}

func main() {
	o := parseFlags()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&o.zap)))

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(kubeflowv1.AddToScheme(scheme))

	cfg, err := ctrl.GetConfig()
	if err != nil {
		fail(fmt.Errorf("no kubeconfig: %w", err))
	}
	// One limiter shared by every client made from cfg, as upstream does.
	cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(float32(o.qps), o.burst)

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: o.metricsAddr},
		HealthProbeBindAddress: o.probeAddr,
		WebhookServer:          webhook.NewServer(webhook.Options{Host: webhookHost, Port: o.webhookPort}),
	})
	if err != nil {
		fail(fmt.Errorf("creating the manager: %w", err))
	}

	certsReady := make(chan struct{}) // closed by the rotator once the serving cert is in place
	if err := cert.ManageCerts(mgr, cert.Config{
		WebhookServiceName:       webhookServiceName,
		WebhookSecretName:        webhookSecretName,
		WebhookConfigurationName: webhookConfigurationName,
	}, certsReady); err != nil {
		fail(fmt.Errorf("setting up the certificate rotator: %w", err))
	}
	if err := addProbes(mgr, certsReady); err != nil {
		fail(err)
	}
	// The rotator runs inside the manager, so the PyTorchJob controller and webhook can only be
	// registered after Start; a manager accepts both while running.
	go registerPyTorchJob(mgr, certsReady, o.controllerThreads)

	log.Info("starting manager", "webhook", net.JoinHostPort(webhookHost, fmt.Sprint(o.webhookPort)),
		"metrics", o.metricsAddr, "probes", o.probeAddr)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "manager stopped")
		os.Exit(1)
	}
}

// addProbes serves /healthz (always ok) and /readyz (ok once the certificates are ready and the
// webhook server is accepting connections).
func addProbes(mgr manager.Manager, certsReady <-chan struct{}) error {
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding the health check: %w", err)
	}
	ready := func(req *http.Request) error {
		select {
		case <-certsReady:
		default:
			return errors.New("webhook certificates not ready yet")
		}
		// Looked up per request: the server has no certificate to serve before certsReady.
		return mgr.GetWebhookServer().StartedChecker()(req)
	}
	if err := mgr.AddReadyzCheck("readyz", ready); err != nil {
		return fmt.Errorf("adding the readiness check: %w", err)
	}
	return nil
}

func registerPyTorchJob(mgr manager.Manager, certsReady <-chan struct{}, controllerThreads int) {
	<-certsReady
	kind := kubeflowv1.PyTorchJobKind
	setupReconciler, ok := controllerv1.SupportedSchemeReconciler[kind]
	if !ok {
		log.Error(errors.New("not in controllerv1.SupportedSchemeReconciler"), "no reconciler", "kind", kind)
		os.Exit(1)
	}
	if err := setupReconciler(mgr, common.GenNonGangSchedulerSetupFunc(), controllerThreads); err != nil {
		log.Error(err, "setting up the controller", "kind", kind)
		os.Exit(1)
	}
	setupWebhook, ok := webhooks.SupportedSchemeWebhook[kind]
	if !ok {
		log.Error(errors.New("not in webhooks.SupportedSchemeWebhook"), "no webhook", "kind", kind)
		os.Exit(1)
	}
	if err := setupWebhook(mgr); err != nil {
		log.Error(err, "registering the validating webhook", "kind", kind)
		os.Exit(1)
	}
	log.Info("PyTorchJob controller and webhook registered", "controllerThreads", controllerThreads)
}
