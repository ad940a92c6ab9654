// Command testenv runs a throwaway Kubernetes control plane (etcd,
// kube-apiserver, kube-controller-manager) and a NATS JetStream server in
// one process on 127.0.0.1, for Herald's end-to-end tests. With
// --nats-cluster N, NATS is instead a JetStream cluster of N nats-server
// child processes (so a node can be SIGKILLed for real). See README.md.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"k8s.io/klog/v2"
)

const usage = `usage:
  testenv run --dir DIR [--keep] [--nats-port N | --nats-cluster N | --nats-secure ACCOUNTS.conf [--nats-jwt]] [--kube-apiserver BINARY] [--parent-pid PID] [--exit-on-stdin-eof]
  testenv nats-restart --dir DIR
  testenv nats-kill --dir DIR --node I      (--nats-cluster only: SIGKILL node I)
  testenv nats-start --dir DIR --node I     (--nats-cluster only: start node I again)
  testenv apiserver-blackout --dir DIR --seconds N
  testenv argo-health SCRIPT.lua < OBJECT.json   (Argo CD's Lua health check of one object)
  testenv kstatus < OBJECT.json                  (kstatus, as Flux's wait computes it)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage); fs.PrintDefaults() }
	dir := fs.String("dir", "", "state directory (kubeconfig, nats-url, control-url, ready, pid, logs)")
	var err error
	switch os.Args[1] {
	case "run":
		var o runOpts
		fs.BoolVar(&o.keep, "keep", false, "keep the temporary data dir (etcd, JetStream, certs) on exit")
		fs.IntVar(&o.natsPort, "nats-port", 0, "NATS client port (default: a free port)")
		fs.IntVar(&o.natsCluster, "nats-cluster", 1, "number of nats-server nodes; >= 2: a JetStream cluster of child processes")
		fs.StringVar(&o.natsSecure, "nats-secure", "", "accounts file (examples/nats/herald-accounts.conf): NATS with TLS, verified client certificates and these accounts; certificates and NKey seeds in DIR/nats-secure/")
		fs.BoolVar(&o.natsJWT, "nats-jwt", false, "with --nats-secure: the same accounts and permissions in operator (JWT) mode, a memory resolver and a .creds file per identity in DIR/nats-secure/")
		fs.IntVar(&o.parentPID, "parent-pid", 0, "exit when this process is gone (polled every second)")
		fs.BoolVar(&o.stdinEOF, "exit-on-stdin-eof", false, "exit when stdin is closed")
		fs.StringVar(&o.kubeAPIServer, "kube-apiserver", "", "run this kube-apiserver binary (another Kubernetes release) instead of the built-in one; the built-in controller-manager is then left out (it must not be newer than its API server)")
		fs.Parse(os.Args[2:])
		o.dir = *dir
		err = run(o)
	case "nats-restart":
		fs.Parse(os.Args[2:])
		err = callControl(*dir, "/nats/restart")
	case "nats-kill", "nats-start":
		node := fs.Int("node", -1, "node index (0-based, as in DIR/nats-nodes)")
		fs.Parse(os.Args[2:])
		err = callControl(*dir, "/nats/"+strings.TrimPrefix(os.Args[1], "nats-")+"?node="+strconv.Itoa(*node))
	case "nats-node": // hidden: one cluster node, started by "run --nats-cluster"
		err = runNATSNode(os.Args[2:])
	case "apiserver-blackout":
		secs := fs.Float64("seconds", 0, "how long the API server stays unreachable")
		fs.Parse(os.Args[2:])
		err = callControl(*dir, "/apiserver/blackout?seconds="+strconv.FormatFloat(*secs, 'f', -1, 64))
	case "argo-health":
		if len(os.Args) != 3 {
			fmt.Fprint(os.Stderr, usage)
			os.Exit(2)
		}
		err = argoHealth(os.Args[2])
	case "kstatus":
		err = kstatusOf()
	default:
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testenv: %v\n", err)
		os.Exit(1)
	}
}

type runOpts struct {
	dir         string
	keep        bool
	natsPort    int
	natsCluster int
	natsSecure  string
	natsJWT     bool
	parentPID   int
	stdinEOF    bool
	// An external kube-apiserver binary; empty: the one built in.
	kubeAPIServer string
}

// outputs written into --dir; removed again on exit so a stale "ready" can
// never be mistaken for a live environment.
var outputs = []string{"ready", "pid", "control-url", "nats-url", "nats-nodes", "kubeconfig"}

func run(o runOpts) (err error) {
	if o.dir == "" {
		return errors.New("--dir is required")
	}
	if o.natsCluster < 1 {
		return errors.New("--nats-cluster must be >= 1")
	}
	if o.natsCluster > 1 && o.natsPort != 0 {
		return errors.New("--nats-port and --nats-cluster cannot be combined (cluster ports are always free ports)")
	}
	if o.natsCluster > 1 && o.natsSecure != "" {
		return errors.New("--nats-secure runs a single server; it cannot be combined with --nats-cluster")
	}
	if o.natsJWT && o.natsSecure == "" {
		return errors.New("--nats-jwt needs --nats-secure ACCOUNTS.conf (the accounts it turns into JWTs)")
	}
	start := time.Now()
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range outputs {
		os.Remove(filepath.Join(dir, f))
	}
	// pid first, so a harness can stop us even while we are starting.
	if err := writeFileAtomic(filepath.Join(dir, "pid"), []byte(strconv.Itoa(os.Getpid()))); err != nil {
		return err
	}
	defer func() {
		for _, f := range outputs {
			os.Remove(filepath.Join(dir, f))
		}
	}()

	// Component logs are far too chatty for stdout; they go to DIR/*.log,
	// which survive exit for post-mortems. stdout only gets "testenv:" lines.
	logf, err := os.Create(filepath.Join(dir, "testenv.log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	setupKlog(logf)
	log.SetOutput(logf)

	dataDir, err := os.MkdirTemp("", "herald-testenv-")
	if err != nil {
		return err
	}
	if o.keep {
		fmt.Printf("testenv: data dir %s (kept on exit)\n", dataDir)
	} else {
		defer os.RemoveAll(dataDir)
	}
	// Kubernetes components exit the process via klog.Fatal on some errors,
	// bypassing our defers; still leave no stale "ready" or data dir behind.
	klog.OsExit = func(code int) {
		for _, f := range outputs {
			os.Remove(filepath.Join(dir, f))
		}
		if !o.keep {
			os.RemoveAll(dataDir)
		}
		fmt.Printf("testenv: a component exited fatally (see %s)\n", logf.Name())
		os.Exit(code)
	}

	// ctx ends on SIGINT/SIGTERM, parent death or stdin EOF.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watchParent(ctx, cancel, o)
	defer func() {
		// Being told to stop while still starting is a clean stop, too.
		if err != nil && ctx.Err() != nil {
			fmt.Printf("testenv: interrupted during startup (%v)\n", err)
			err = nil
		}
	}()

	var cleanups []func() // run in reverse order
	defer func() {
		fmt.Println("testenv: stopping")
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
		klog.Flush()
		fmt.Println("testenv: stopped")
	}()

	etcd, etcdURL, err := startEtcd(dataDir, filepath.Join(dir, "etcd.log"))
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() {
		etcd.Close()
	})

	// A cluster's node processes start now, next to the API server; it is
	// waited for (meta leader elected) just before "ready".
	var nats natsBackend
	if o.natsCluster > 1 {
		nats, err = newNATSCluster(dataDir, dir, o.natsCluster)
	} else {
		var base *server.Options
		if o.natsSecure != "" {
			if base, err = natsSecureOptions(dir, dataDir, o.natsSecure, o.natsJWT); err != nil {
				return err
			}
		}
		nats, err = newNATS(dataDir, filepath.Join(dir, "nats.log"), o.natsPort, base)
	}
	if err != nil {
		return err
	}
	cleanups = append(cleanups, nats.stop)

	p, err := newPKI(dataDir)
	if err != nil {
		return err
	}

	// Components get their own contexts so shutdown can go in order:
	// controller-manager, then apiserver, then etcd under them.
	apiCtx, apiCancel := context.WithCancel(context.Background())
	var api *apiServer
	cleanups = append(cleanups, func() {
		apiCancel()
		if api != nil {
			api.wait(30*time.Second, "kube-apiserver")
		}
	})
	if o.kubeAPIServer != "" {
		api, err = startExternalAPIServer(apiCtx, o.kubeAPIServer, dataDir, etcdURL, filepath.Join(dir, "kube-apiserver.log"), p)
	} else {
		api, err = startAPIServer(apiCtx, dataDir, etcdURL, p)
	}
	if err != nil {
		return err
	}

	px, err := startProxy(fmt.Sprintf("127.0.0.1:%d", api.port))
	if err != nil {
		return err
	}
	cleanups = append(cleanups, px.stop)
	serverURL := "https://" + px.addr

	if err := waitAPIReady(ctx, serverURL, p, api.task); err != nil {
		return err
	}

	// The controller-manager talks to the API server directly (see
	// controllermanager.go), through its own kubeconfig in the data dir.
	internalKubeconfig := filepath.Join(dataDir, "kubeconfig-direct")
	if err := os.WriteFile(internalKubeconfig, p.kubeconfig(fmt.Sprintf("https://127.0.0.1:%d", api.port)), 0o600); err != nil {
		return err
	}
	kcmCtx, kcmCancel := context.WithCancel(context.Background())
	var kcm *task
	cleanups = append(cleanups, func() {
		kcmCancel()
		if kcm != nil {
			kcm.wait(15*time.Second, "kube-controller-manager")
		}
	})
	if o.kubeAPIServer == "" {
		if kcm, err = startControllerManager(kcmCtx, internalKubeconfig); err != nil {
			return err
		}
	}

	if err := nats.waitReady(ctx); err != nil {
		return err
	}

	ctl, err := startControl(nats, px)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, ctl.stop)

	files := []struct{ name, data string }{
		{"kubeconfig", string(p.kubeconfig(serverURL))},
		{"nats-url", nats.url()},
		{"nats-nodes", strings.Join(nats.nodeURLs(), "\n") + "\n"},
		{"control-url", ctl.url},
		{"ready", time.Now().UTC().Format(time.RFC3339)},
	}
	for _, f := range files {
		if err := writeFileAtomic(filepath.Join(dir, f.name), []byte(f.data)); err != nil {
			return err
		}
	}
	fmt.Printf("testenv: apiserver %s (direct 127.0.0.1:%d), nats %s, control %s\n", serverURL, api.port, nats.url(), ctl.url)
	fmt.Printf("testenv: up in %.1fs\n", time.Since(start).Seconds())
	fmt.Println("testenv: ready")

	var kcmDone <-chan struct{} // nil (never ready) without a controller-manager
	if kcm != nil {
		kcmDone = kcm.done
	}
	select {
	case <-ctx.Done():
		return nil
	case <-api.done:
		return fmt.Errorf("kube-apiserver exited: %v", api.err)
	case <-kcmDone:
		return fmt.Errorf("kube-controller-manager exited: %v", kcm.err)
	case err := <-etcd.Err():
		return fmt.Errorf("etcd failed: %v", err)
	}
}

func setupKlog(w io.Writer) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	fs.Set("logtostderr", "false")
	fs.Set("alsologtostderr", "false")
	fs.Set("stderrthreshold", "FATAL")
	fs.Set("one_output", "true") // else each error line is written 3 times
	klog.SetOutput(w)
}

// task is a component's Run function executing in the background.
type task struct {
	done chan struct{} // closed when run has returned
	err  error         // run's result, valid after done is closed
}

func goTask(run func() error) *task {
	t := &task{done: make(chan struct{})}
	go func() {
		defer close(t.done)
		t.err = run()
	}()
	return t
}

// wait waits (bounded) for the task to return after its context was
// cancelled. Whatever is still running then ends with the process.
func (t *task) wait(d time.Duration, what string) {
	select {
	case <-t.done:
		if t.err != nil && !errors.Is(t.err, context.Canceled) {
			klog.Infof("%s stopped: %v", what, t.err)
		}
	case <-time.After(d):
		fmt.Printf("testenv: %s did not stop within %s; exiting anyway\n", what, d)
	}
}

// waitAPIReady polls through the proxy, exactly as tests will connect:
// /readyz must be ok and the "default" namespace must exist.
//
// A signal (ctx done) does not abort the wait at once: kube-apiserver
// klog.Fatal()s (exit 255) if it is stopped while its post-start hooks are
// still running, so we give it up to 20 s to finish starting and then stop
// it cleanly.
func waitAPIReady(ctx context.Context, server string, p *pki, api *task) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.caPEM)
	client := &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	defer client.CloseIdleConnections()
	ok := func(path string) bool {
		req, _ := http.NewRequest(http.MethodGet, server+path, nil)
		req.Header.Set("Authorization", "Bearer "+p.adminToken)
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	deadline := time.Now().Add(2 * time.Minute)
	interrupted := false
	for _, path := range []string{"/readyz", "/api/v1/namespaces/default"} {
		for !ok(path) {
			if ctx.Err() != nil && !interrupted {
				interrupted = true
				if grace := time.Now().Add(20 * time.Second); grace.Before(deadline) {
					deadline = grace
				}
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("kube-apiserver: %s not ok in time (see testenv.log)", path)
			}
			select {
			case <-api.done:
				return fmt.Errorf("kube-apiserver exited: %v", api.err)
			case <-time.After(200 * time.Millisecond):
			}
		}
	}
	if ctx.Err() != nil {
		return errors.New("interrupted while waiting for kube-apiserver")
	}
	return nil
}

// watchParent cancels ctx when the parent is gone, so a crashed test runner
// does not leave a control plane behind.
func watchParent(ctx context.Context, cancel context.CancelFunc, o runOpts) {
	if o.parentPID > 0 {
		go func() {
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if err := syscall.Kill(o.parentPID, 0); errors.Is(err, syscall.ESRCH) {
						fmt.Printf("testenv: parent %d is gone\n", o.parentPID)
						cancel()
						return
					}
				}
			}
		}()
	}
	if o.stdinEOF {
		go func() {
			io.Copy(io.Discard, os.Stdin)
			fmt.Println("testenv: stdin closed")
			cancel()
		}()
	}
}
