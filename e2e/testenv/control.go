package main

import (
	"bytes"
	"context"
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
	nats  *natsServer
	proxy *proxy
	srv   *http.Server
	url   string
}

func startControl(n *natsServer, p *proxy) (*control, error) {
	ln, err := listenLoopback()
	if err != nil {
		return nil, err
	}
	c := &control{nats: n, proxy: p, url: "http://" + ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if !n.ready() {
			http.Error(w, "nats not ready", http.StatusServiceUnavailable)
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

// callControl implements the nats-restart / apiserver-blackout subcommands.
func callControl(dir, path string) error {
	b, err := os.ReadFile(filepath.Join(dir, "control-url"))
	if err != nil {
		return fmt.Errorf("is testenv running with --dir %s? %w", dir, err)
	}
	url := strings.TrimSpace(string(b)) + path
	client := &http.Client{Timeout: 60 * time.Second}
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
