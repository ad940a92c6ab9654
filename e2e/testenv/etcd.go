package main

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// startEtcd runs a single-member etcd inside this process. Both the client
// and the (unused, but mandatory) peer listener are on 127.0.0.1. etcd binds
// its ports itself, so a port we picked may be taken meanwhile: retry.
func startEtcd(dataDir, logFile string) (e *embed.Etcd, url string, err error) {
	for range 5 {
		e, url, err = startEtcdOnce(dataDir, logFile)
		// etcd does not always wrap the syscall error, so match the text.
		if err == nil || !strings.Contains(err.Error(), "address already in use") {
			return e, url, err
		}
		os.RemoveAll(filepath.Join(dataDir, "etcd"))
	}
	return e, url, err
}

func startEtcdOnce(dataDir, logFile string) (*embed.Etcd, string, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	clientURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", clientPort)}
	peerURL := url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", peerPort)}

	cfg := embed.NewConfig()
	cfg.Name = "testenv"
	cfg.Dir = filepath.Join(dataDir, "etcd")
	cfg.ListenClientUrls = []url.URL{clientURL}
	cfg.AdvertiseClientUrls = []url.URL{clientURL}
	cfg.ListenPeerUrls = []url.URL{peerURL}
	cfg.AdvertisePeerUrls = []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{logFile}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", fmt.Errorf("start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, "", fmt.Errorf("etcd failed: %w", err)
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, "", fmt.Errorf("etcd not ready after 30s")
	}
	return e, clientURL.String(), nil
}
