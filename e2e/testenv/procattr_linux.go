package main

import "syscall"

// childProcAttr: a nats node gets SIGKILL when testenv dies, however it
// dies (see spawn for the thread caveat), and gets its own process group, so
// a Ctrl-C in a terminal reaches testenv only, which then stops the nodes
// in order.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
}

// selfExe is the running testenv binary. /proc/self/exe (resolved in the
// child) stays valid even if the file was replaced by a rebuild meanwhile.
func selfExe() (string, error) { return "/proc/self/exe", nil }
