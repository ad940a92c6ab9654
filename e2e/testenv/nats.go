package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// natsServer wraps an embedded nats-server with JetStream and can restart it
// on the same port with the same store dir, so streams and consumers survive
// a restart exactly as with a real server process being restarted.
type natsServer struct {
	mu   sync.Mutex
	opts server.Options
	srv  *server.Server
}

// newNATS starts a single server; base, when not nil, holds options parsed from a
// configuration file (--nats-secure: TLS and accounts) that the rest is added to.
func newNATS(dataDir, logFile string, port int, base *server.Options) (*natsServer, error) {
	if port == 0 {
		var err error
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	opts := server.Options{}
	if base != nil {
		opts = *base
	}
	opts.ServerName = "testenv"
	opts.Host = "127.0.0.1"
	opts.Port = port
	opts.JetStream = true
	opts.StoreDir = filepath.Join(dataDir, "jetstream")
	opts.JetStreamMaxMemory = 256 << 20
	opts.JetStreamMaxStore = 2 << 30
	opts.NoSigs = true // signals belong to testenv, not to nats
	opts.LogFile = logFile
	n := &natsServer{opts: opts}
	if err := n.start(); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *natsServer) url() string {
	scheme := "nats"
	if n.opts.TLSConfig != nil {
		scheme = "tls"
	}
	return fmt.Sprintf("%s://127.0.0.1:%d", scheme, n.opts.Port)
}

// start must be called with n.mu held or before n is shared.
func (n *natsServer) start() error {
	opts := n.opts // NewServer may mutate the options it is given
	srv, err := server.NewServer(&opts)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	srv.ConfigureLogger()
	go srv.Start()
	if !srv.ReadyForConnections(15 * time.Second) {
		srv.Shutdown()
		return fmt.Errorf("nats: not ready for connections on port %d after 15s", n.opts.Port)
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		return fmt.Errorf("nats: JetStream is not enabled")
	}
	n.srv = srv
	return nil
}

func (n *natsServer) restart() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stopLocked()
	// The port may take a moment to be released; retry briefly.
	var err error
	for i := 0; i < 50; i++ {
		if err = n.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return err
}

func (n *natsServer) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stopLocked()
}

func (n *natsServer) stopLocked() {
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
}

func (n *natsServer) ready() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil && n.srv.Running() && n.srv.JetStreamEnabled() {
		return nil
	}
	return errors.New("nats not ready")
}

// The rest of natsBackend: a single server is ready once newNATS returned,
// and has no nodes to kill or start.
func (n *natsServer) nodeURLs() []string                  { return []string{n.url()} }
func (n *natsServer) clustered() bool                     { return false }
func (n *natsServer) waitReady(ctx context.Context) error { return nil }
func (n *natsServer) killNode(int) error                  { return errNotClustered }
func (n *natsServer) startNode(int) error                 { return errNotClustered }

var errNotClustered = errors.New("not a NATS cluster: run testenv with --nats-cluster N (N >= 2)")
