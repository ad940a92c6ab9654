package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/spf13/pflag"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/rest"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

// apiServer is kube-apiserver running in this process. We build its options
// from flags ourselves instead of running app.NewAPIServerCommand(): the
// command installs its own SIGTERM handler (and exits on the second signal),
// while we need to own signals and stop components in order.
type apiServer struct {
	*task
	port int
}

func startAPIServer(ctx context.Context, dataDir, etcdURL string, p *pki) (*apiServer, error) {
	// Open the listener ourselves and hand it over, so there is no window in
	// which another process could take the port.
	ln, err := listenLoopback()
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port

	s := options.NewServerRunOptions()
	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	if err := fs.Parse(apiServerArgs(port, dataDir, etcdURL, p)); err != nil {
		ln.Close()
		return nil, fmt.Errorf("kube-apiserver flags: %w", err)
	}
	s.SecureServing.Listener = ln
	if err := s.GenericServerRunOptions.ComponentGlobalsRegistry.Set(); err != nil {
		ln.Close()
		return nil, err
	}
	// The server's own loopback client would otherwise log warnings it
	// issues to itself (same as the upstream command does).
	rest.SetDefaultWarningHandler(rest.NoWarnings{})

	completed, err := s.Complete(ctx)
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		ln.Close()
		return nil, fmt.Errorf("kube-apiserver options: %w", utilerrors.NewAggregate(errs))
	}

	return &apiServer{port: port, task: goTask(func() error { return app.Run(ctx, completed) })}, nil
}

// startExternalAPIServer runs another kube-apiserver binary (an older
// Kubernetes release: the oldest one Herald claims to support is tested this
// way) as a child process with the same flags, certificates and etcd; its
// output goes to logPath. The port is probed and released first: the binary
// binds it itself.
func startExternalAPIServer(ctx context.Context, binary, dataDir, etcdURL, logPath string, p *pki) (*apiServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, binary, apiServerArgs(port, dataDir, etcdURL, p)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childProcAttr()
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	if err := spawn(cmd); err != nil {
		logf.Close()
		return nil, fmt.Errorf("kube-apiserver %s: %w", binary, err)
	}
	return &apiServer{port: port, task: goTask(func() error {
		defer logf.Close()
		err := cmd.Wait()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%s exited: %v (see %s)", binary, err, logPath)
	})}, nil
}

// apiServerArgs are the test environment's kube-apiserver flags, for the one
// in this process and for an external binary alike.
func apiServerArgs(port int, dataDir, etcdURL string, p *pki) []string {
	return []string{
		"--bind-address=127.0.0.1",
		fmt.Sprintf("--secure-port=%d", port),
		"--advertise-address=127.0.0.1",
		// Endpoints may not hold loopback IPs, so the "kubernetes" service
		// endpoint reconciler would only log errors; turn it off.
		"--endpoint-reconciler-type=none",
		"--cert-dir=" + filepath.Join(dataDir, "apiserver-certs"),
		"--tls-cert-file=" + p.certFile,
		"--tls-private-key-file=" + p.keyFile,
		"--token-auth-file=" + p.tokenFile,
		"--authorization-mode=RBAC",
		"--service-account-key-file=" + p.saKeyFile,
		"--service-account-signing-key-file=" + p.saKeyFile,
		"--service-account-issuer=https://kubernetes.default.svc",
		"--etcd-servers=" + etcdURL,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--profiling=false",
	}
}
