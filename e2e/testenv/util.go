package main

import (
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
)

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// listenLoopback binds a random port on 127.0.0.1 BELOW the kernel's
// ephemeral range. Ports handed out by ":0" come from the ephemeral range,
// which every outgoing connection on the machine also draws from; a port we
// probe-and-release (etcd, NATS) or temporarily close (proxy blackout)
// could then be taken by some client socket before we bind it again.
func listenLoopback() (net.Listener, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		fmt.Sscan(string(b), &low)
	}
	if low > 11024 {
		for range 100 {
			port := 10000 + rand.IntN(low-10000)
			if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
				return l, nil
			}
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}

// freePort returns a currently unused loopback port (see listenLoopback)
// for components that insist on binding themselves.
func freePort() (int, error) {
	l, err := listenLoopback()
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// writeFileAtomic writes via a temp file + rename so that readers polling
// for a file (e.g. DIR/ready) never see it half-written.
func writeFileAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("rename %s: %w", path, err)
	}
	return nil
}
