//go:build !linux

package main

import (
	"os"
	"syscall"
)

// childProcAttr: no Pdeathsig outside Linux; nats-node polls its parent pid
// instead (see runNATSNode).
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

func selfExe() (string, error) { return os.Executable() }
