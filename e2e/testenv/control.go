package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// control is the small HTTP API fault tests use to break things on purpose.
type control struct {
	nats  natsBackend
	proxy *proxy
	srv   *http.Server
	url   string
}

func startControl(n natsBackend, p *proxy) (*control, error) {
	ln, err := listenLoopback()
	if err != nil {
		return nil, err
	}
	c := &control{nats: n, proxy: p, url: "http://" + ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := n.ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("POST /nats/restart", func(w http.ResponseWriter, r *http.Request) {
		if err := n.restart(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		io.WriteString(w, "nats restarted\n")
	})
	// Cluster mode only: SIGKILL node I / start it again.
	nodeOp := func(what string, op func(int) error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			i, err := strconv.Atoi(r.URL.Query().Get("node"))
			switch {
			case !n.clustered():
				http.Error(w, errNotClustered.Error(), http.StatusBadRequest)
				return
			case err != nil || i < 0 || i >= len(n.nodeURLs()):
				http.Error(w, fmt.Sprintf("node must be 0..%d", len(n.nodeURLs())-1), http.StatusBadRequest)
				return
			}
			if err := op(i); err != nil {
				code := http.StatusInternalServerError
				if errors.Is(err, errNodeState) {
					code = http.StatusConflict
				}
				http.Error(w, err.Error(), code)
				return
			}
			fmt.Fprintf(w, "nats node %d %s\n", i, what)
		}
	}
	mux.HandleFunc("POST /nats/kill", nodeOp("killed", n.killNode))
	mux.HandleFunc("POST /nats/start", nodeOp("started", n.startNode))
	mux.HandleFunc("POST /apiserver/blackout", func(w http.ResponseWriter, r *http.Request) {
		secs, err := strconv.ParseFloat(r.URL.Query().Get("seconds"), 64)
		if err != nil || secs <= 0 {
			http.Error(w, "seconds must be a positive number", http.StatusBadRequest)
			return
		}
		p.blackout(time.Duration(secs * float64(time.Second)))
		fmt.Fprintf(w, "apiserver dark for %gs\n", secs)
	})
	c.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go c.srv.Serve(ln)
	return c, nil
}

func (c *control) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if c.srv.Shutdown(ctx) != nil {
		c.srv.Close()
	}
}

// callControl implements the nats-restart / nats-kill / nats-start /
// apiserver-blackout subcommands.
func callControl(dir, path string) error {
	b, err := os.ReadFile(filepath.Join(dir, "control-url"))
	if err != nil {
		return fmt.Errorf("is testenv running with --dir %s? %w", dir, err)
	}
	url := strings.TrimSpace(string(b)) + path
	// A rolling nats-restart of a cluster waits for every node to catch up.
	client := &http.Client{Timeout: 5 * time.Minute}
	resp, err := client.Post(url, "text/plain", nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", path, resp.Status, bytes.TrimSpace(body))
	}
	os.Stdout.Write(body)
	return nil
}
