package main

import "syscall"

// childProcAttr makes a child process die with this one (a SIGKILLed router
// leaves no engine behind).
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
