package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// natsBackend is what the rest of testenv (control server, DIR files) needs
// from NATS: one embedded server (natsServer) or a cluster of nats-server
// child processes (natsCluster).
type natsBackend interface {
	url() string        // DIR/nats-url
	nodeURLs() []string // DIR/nats-nodes, node i on line i
	clustered() bool
	waitReady(ctx context.Context) error
	ready() error
	restart() error
	killNode(i int) error
	startNode(i int) error
	stop()
}

// errNodeState: the node is not in the state the operation needs
// (control answers 409).
var errNodeState = errors.New("wrong node state")

// startTimeout bounds how long a node may take to answer /healthz ok after
// its process was started (catch-up included).
const startTimeout = 60 * time.Second

// natsCluster is a JetStream cluster of N nats-server nodes, each in its own
// child process ("testenv nats-node --config F"), so that killNode is a real
// SIGKILL of a real server process: no graceful shutdown, no flush, whatever
// was not fsynced or replicated is gone, exactly as after a crash.
type natsCluster struct {
	exe   string
	nodes []*natsNode
	mu    sync.Mutex // serializes kill/start/restart/stop
}

type natsNode struct {
	name                           string // n0, n1, ...: server_name, as in stream info
	clientPort, clusterPort, mPort int    // all fixed for the node's life, so restarts rejoin
	config, storeDir, logPath      string
	proc                           atomic.Pointer[nodeProc] // nil when not started / stopped
	clientURL, healthURL, jszURL   string
}

// nodeProc is one incarnation (process) of a node.
type nodeProc struct {
	cmd      *exec.Cmd
	done     chan struct{} // closed once the process has exited and been reaped
	err      error         // Wait's result, valid after done
	expected atomic.Bool   // we killed/stopped it: no "exited unexpectedly" message
}

func (p *nodeProc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func newNATSCluster(dataDir, envDir string, size int) (*natsCluster, error) {
	exe, err := selfExe()
	if err != nil {
		return nil, err
	}
	c := &natsCluster{exe: exe}
	for i := range size {
		n := &natsNode{name: fmt.Sprintf("n%d", i)}
		for _, p := range []*int{&n.clientPort, &n.clusterPort, &n.mPort} {
			if *p, err = freePort(); err != nil {
				return nil, err
			}
		}
		n.storeDir = filepath.Join(dataDir, "nats-"+n.name)
		n.config = filepath.Join(dataDir, "nats-"+n.name+".conf")
		n.logPath = filepath.Join(envDir, "nats-"+n.name+".log")
		n.clientURL = fmt.Sprintf("nats://127.0.0.1:%d", n.clientPort)
		n.healthURL = fmt.Sprintf("http://127.0.0.1:%d/healthz", n.mPort)
		n.jszURL = fmt.Sprintf("http://127.0.0.1:%d/jsz", n.mPort)
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		if err := os.WriteFile(n.config, c.configFor(n), 0o644); err != nil {
			return nil, err
		}
		// Fresh log per testenv run; restarts of the node append to it.
		os.Remove(n.logPath)
	}
	// Start every process first (a meta leader needs a quorum of them), then
	// waitReady checks them all.
	for _, n := range c.nodes {
		if err := c.spawnNode(n); err != nil {
			c.stop()
			return nil, err
		}
	}
	return c, nil
}

// configFor is node n's nats-server configuration file: client, cluster
// and monitoring listeners on 127.0.0.1, explicit routes to every other
// node, its own JetStream store dir.
func (c *natsCluster) configFor(n *natsNode) []byte {
	var routes []string
	for _, o := range c.nodes {
		if o != n {
			routes = append(routes, fmt.Sprintf("    %q", fmt.Sprintf("nats-route://127.0.0.1:%d", o.clusterPort)))
		}
	}
	return fmt.Appendf(nil, `# written by testenv: node %[1]s of a %[2]d-node JetStream cluster
server_name: %[1]q
host: "127.0.0.1"
port: %[3]d
http: "127.0.0.1:%[4]d"
logtime: true
jetstream {
  store_dir: %[5]q
  max_memory_store: 268435456
  max_file_store: 2147483648
}
cluster {
  name: "testenv"
  host: "127.0.0.1"
  port: %[6]d
  routes: [
%[7]s
  ]
}
`, n.name, len(c.nodes), n.clientPort, n.mPort, n.storeDir, n.clusterPort, strings.Join(routes, "\n"))
}

func (c *natsCluster) url() string { return strings.Join(c.nodeURLs(), ",") }

func (c *natsCluster) nodeURLs() []string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = n.clientURL
	}
	return urls
}

func (c *natsCluster) clustered() bool { return true }

// spawnNode starts node n's process (without waiting for it to be ready).
// Its stdout/stderr (the nats-server log) are appended to DIR/nats-nI.log.
func (c *natsCluster) spawnNode(n *natsNode) error {
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	fmt.Fprintf(logf, "==== testenv: starting node %s at %s\n", n.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(c.exe, "nats-node", "--config", n.config)
	cmd.Args[0] = os.Args[0] // readable in ps, whatever exe is
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childProcAttr()
	if err := spawn(cmd); err != nil {
		return fmt.Errorf("nats node %s: %w", n.name, err)
	}
	p := &nodeProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		if !p.expected.Load() {
			fmt.Printf("testenv: nats node %s exited unexpectedly (%v); see %s\n", n.name, p.err, n.logPath)
		}
		close(p.done)
	}()
	n.proc.Store(p)
	return nil
}

// waitHealthy polls the node's /healthz until it is ok: the server accepts
// connections, knows the meta leader, is current with it, and every stream
// and consumer replica it holds is current (caught up).
func (c *natsCluster) waitHealthy(ctx context.Context, n *natsNode, deadline time.Time) error {
	p := n.proc.Load()
	if p == nil {
		return fmt.Errorf("nats node %s: not started", n.name)
	}
	last := "no answer"
	for {
		code, body, err := httpGet(n.healthURL)
		if err == nil && code == http.StatusOK {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%d %s", code, strings.TrimSpace(body))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats node %s: /healthz not ok in time (last: %s; see %s)", n.name, last, n.logPath)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
			return fmt.Errorf("nats node %s: process exited during startup (%v; see %s)", n.name, p.err, n.logPath)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitReady: every node healthy, and all of them name the same JetStream
// meta leader with the full cluster size.
func (c *natsCluster) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(startTimeout)
	for _, n := range c.nodes {
		if err := c.waitHealthy(ctx, n, deadline); err != nil {
			return err
		}
	}
	for {
		leader, err := c.metaLeader()
		if err == nil {
			for _, n := range c.nodes {
				fmt.Printf("testenv: nats node %s: client %s, cluster 127.0.0.1:%d, monitor http://127.0.0.1:%d, pid %d\n",
					n.name, n.clientURL, n.clusterPort, n.mPort, n.proc.Load().cmd.Process.Pid)
			}
			fmt.Printf("testenv: nats cluster of %d nodes, JetStream meta leader %s\n", len(c.nodes), leader)
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// metaLeader asks every node's /jsz for the meta leader; they must agree.
func (c *natsCluster) metaLeader() (string, error) {
	leader := ""
	for _, n := range c.nodes {
		code, body, err := httpGet(n.jszURL)
		if err != nil {
			return "", fmt.Errorf("nats node %s: /jsz: %w", n.name, err)
		}
		var jsz struct {
			Meta *struct {
				Leader string `json:"leader"`
				Size   int    `json:"cluster_size"`
			} `json:"meta_cluster"`
		}
		if code != http.StatusOK || json.Unmarshal([]byte(body), &jsz) != nil || jsz.Meta == nil {
			return "", fmt.Errorf("nats node %s: /jsz: %d %.200s", n.name, code, body)
		}
		switch {
		case jsz.Meta.Leader == "":
			return "", fmt.Errorf("nats node %s: no JetStream meta leader yet", n.name)
		case jsz.Meta.Size != len(c.nodes):
			return "", fmt.Errorf("nats node %s: meta cluster size %d, want %d", n.name, jsz.Meta.Size, len(c.nodes))
		case leader != "" && leader != jsz.Meta.Leader:
			return "", fmt.Errorf("nats nodes disagree on the meta leader (%s, %s)", leader, jsz.Meta.Leader)
		}
		leader = jsz.Meta.Leader
	}
	return leader, nil
}

// ready (control /healthz): every node runs and its own /healthz is ok.
// A node killed with nats-kill makes this fail until nats-start.
func (c *natsCluster) ready() error {
	for _, n := range c.nodes {
		if p := n.proc.Load(); p == nil || !p.running() {
			return fmt.Errorf("nats node %s is not running", n.name)
		}
		if code, body, err := httpGet(n.healthURL); err != nil || code != http.StatusOK {
			return fmt.Errorf("nats node %s not healthy: %d %v %s", n.name, code, err, strings.TrimSpace(body))
		}
	}
	return nil
}

func (c *natsCluster) node(i int) (*natsNode, error) {
	if i < 0 || i >= len(c.nodes) {
		return nil, fmt.Errorf("no nats node %d (nodes 0..%d)", i, len(c.nodes)-1)
	}
	return c.nodes[i], nil
}

// killNode sends SIGKILL to node i's process and returns once it is gone
// (reaped; its ports are closed).
func (c *natsCluster) killNode(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.node(i)
	if err != nil {
		return err
	}
	p := n.proc.Load()
	if p == nil || !p.running() {
		return fmt.Errorf("nats node %s is not running: %w", n.name, errNodeState)
	}
	p.expected.Store(true)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("nats node %s: kill: %w", n.name, err)
	}
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("nats node %s (pid %d) still there 10s after SIGKILL", n.name, p.cmd.Process.Pid)
	}
	n.proc.Store(nil)
	fmt.Printf("testenv: nats node %s killed (SIGKILL, pid %d)\n", n.name, p.cmd.Process.Pid)
	return nil
}

// startNode starts node i again: same config, ports and store dir, so it
// rejoins the cluster and catches up. Returns once its /healthz is ok.
func (c *natsCluster) startNode(i int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.node(i)
	if err != nil {
		return err
	}
	if p := n.proc.Load(); p != nil && p.running() {
		return fmt.Errorf("nats node %s is already running: %w", n.name, errNodeState)
	}
	if err := c.startAndWait(n); err != nil {
		return err
	}
	fmt.Printf("testenv: nats node %s started (pid %d)\n", n.name, n.proc.Load().cmd.Process.Pid)
	return nil
}

// startAndWait spawns node n and waits until it is healthy. A process that
// exits during startup (a port not yet released, say) is started again, a
// few times.
func (c *natsCluster) startAndWait(n *natsNode) error {
	deadline := time.Now().Add(startTimeout)
	for attempt := 1; ; attempt++ {
		if err := c.spawnNode(n); err != nil {
			return err
		}
		err := c.waitHealthy(context.Background(), n, deadline)
		if err == nil {
			return nil
		}
		p := n.proc.Load()
		if p.running() || attempt == 5 || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// restart (nats-restart in cluster mode) is a rolling restart: node by node,
// a graceful stop (SIGTERM), a start with the same store, and a wait until
// the node is healthy (caught up) before the next one. Replicated (R3)
// streams stay available throughout; clients connected to the node being
// restarted reconnect to another one.
func (c *natsCluster) restart() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if p := n.proc.Load(); p != nil && p.running() {
			terminate([]*nodeProc{p})
		}
		n.proc.Store(nil)
		if err := c.startAndWait(n); err != nil {
			return err
		}
	}
	return nil
}

// stop ends every node: SIGTERM, then SIGKILL for any still there after 10 s.
func (c *natsCluster) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	var procs []*nodeProc
	for _, n := range c.nodes {
		if p := n.proc.Load(); p != nil {
			procs = append(procs, p)
		}
		n.proc.Store(nil)
	}
	terminate(procs)
}

// terminate stops the processes (SIGTERM, after 10 s SIGKILL) and reaps them.
func terminate(procs []*nodeProc) {
	for _, p := range procs {
		p.expected.Store(true)
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	grace := time.After(10 * time.Second)
	for _, p := range procs {
		select {
		case <-p.done:
			continue
		case <-grace:
		}
		fmt.Printf("testenv: nats node pid %d ignored SIGTERM for 10s; killing it\n", p.cmd.Process.Pid)
		p.cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
		}
	}
}

// spawnCh feeds the spawner goroutine. On Linux, Pdeathsig fires when the
// *thread* that started the child exits, not the process (golang/go#27505),
// and the Go runtime ends threads whose goroutine exits while locked to
// them. So every node process is started from one goroutine that locks its
// thread and never returns: the thread lives exactly as long as testenv.
var (
	spawnCh   = make(chan spawnRequest)
	spawnOnce sync.Once
)

type spawnRequest struct {
	cmd *exec.Cmd
	err chan error
}

func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		go func() {
			runtime.LockOSThread() // never unlocked
			for r := range spawnCh {
				r.err <- r.cmd.Start()
			}
		}()
	})
	r := spawnRequest{cmd: cmd, err: make(chan error, 1)}
	spawnCh <- r
	return <-r.err
}

func httpGet(url string) (int, string, error) {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
}

// runNATSNode is the hidden "testenv nats-node --config F" subcommand: one
// nats-server in this process, configured by a nats-server config file.
// SIGTERM/SIGINT shut it down gracefully; it also exits when its parent
// (testenv) is gone: Pdeathsig on Linux, and a ppid check everywhere.
func runNATSNode(args []string) error {
	fs := flag.NewFlagSet("nats-node", flag.ExitOnError)
	config := fs.String("config", "", "nats-server config file")
	fs.Parse(args)
	if *config == "" {
		return errors.New("nats-node: --config is required")
	}
	ppid := os.Getppid()
	opts, err := server.ProcessConfigFile(*config)
	if err != nil {
		return fmt.Errorf("nats-node: %w", err)
	}
	opts.NoSigs = true // our own handling below
	srv, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("nats-node: %w", err)
	}
	srv.ConfigureLogger()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		return fmt.Errorf("nats-node %s: not ready for connections after 30s", opts.ServerName)
	}
	shutdown := make(chan struct{})
	go func() {
		srv.WaitForShutdown()
		close(shutdown)
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case s := <-sigs:
			fmt.Fprintf(os.Stderr, "nats-node %s: %v, shutting down\n", opts.ServerName, s)
			srv.Shutdown()
			srv.WaitForShutdown()
			return nil
		case <-shutdown:
			return fmt.Errorf("nats-node %s: server shut down by itself", opts.ServerName)
		case <-tick.C:
			if os.Getppid() != ppid {
				fmt.Fprintf(os.Stderr, "nats-node %s: parent %d is gone, shutting down\n", opts.ServerName, ppid)
				srv.Shutdown()
				srv.WaitForShutdown()
				return nil
			}
		}
	}
}
