package main

import (
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// proxy is a plain TCP forwarder in front of the API server. TLS passes
// through untouched (the serving cert covers 127.0.0.1), so clients cannot
// tell it is there. Its only purpose is blackout(): while dark the port is
// closed (connects are refused) and every proxied connection is cut, which
// is what a client sees when the API server becomes unreachable.
type proxy struct {
	addr    string // 127.0.0.1:port the proxy listens on
	backend string

	mu       sync.Mutex
	ln       net.Listener // nil while dark or stopped
	conns    map[net.Conn]struct{}
	darkTill time.Time
	timer    *time.Timer
	stopped  bool
}

func startProxy(backend string) (*proxy, error) {
	ln, err := listenLoopback()
	if err != nil {
		return nil, err
	}
	p := &proxy{addr: ln.Addr().String(), backend: backend, conns: map[net.Conn]struct{}{}}
	p.ln = ln
	go p.serve(ln)
	return p, nil
}

func (p *proxy) serve(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return // listener closed by blackout or stop
		}
		go p.handle(c)
	}
}

func (p *proxy) handle(client net.Conn) {
	server, err := net.DialTimeout("tcp", p.backend, 5*time.Second)
	if err != nil {
		client.Close()
		return
	}
	if !p.track(client, server) {
		client.Close()
		server.Close()
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	// Either direction ending ends the pair; closing both unblocks the other
	// copy. HTTP/2 clients reconnect on their own.
	<-done
	client.Close()
	server.Close()
	p.untrack(client, server)
}

// track registers a live pair; it refuses if the proxy went dark meanwhile,
// so no connection accepted just before a blackout survives it.
func (p *proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln == nil {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

// blackout closes the listener and all proxied connections now, and
// reopens the same port after d. A blackout during a blackout extends it.
func (p *proxy) blackout(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return
	}
	p.goDarkLocked()
	if until := time.Now().Add(d); until.After(p.darkTill) {
		p.darkTill = until
		if p.timer != nil {
			p.timer.Stop()
		}
		p.timer = time.AfterFunc(d, p.reopen)
	}
}

func (p *proxy) goDarkLocked() {
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

func (p *proxy) reopen() {
	// The old socket is closed, and Go sets SO_REUSEADDR, so the bind
	// normally succeeds at once; retry briefly in case it does not.
	for i := 0; i < 100; i++ {
		p.mu.Lock()
		// time.Now() < darkTill means this timer was superseded by a longer
		// blackout whose own timer will reopen.
		if p.stopped || p.ln != nil || time.Now().Before(p.darkTill) {
			p.mu.Unlock()
			return
		}
		ln, err := net.Listen("tcp", p.addr)
		if err == nil {
			p.ln = ln
			p.darkTill = time.Time{}
			p.mu.Unlock()
			go p.serve(ln)
			return
		}
		p.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Printf("testenv: proxy could not reopen %s\n", p.addr)
}

func (p *proxy) stop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stopped = true
	if p.timer != nil {
		p.timer.Stop()
	}
	p.goDarkLocked()
}
