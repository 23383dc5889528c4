//go:build !linux

package main

import "syscall"

// childProcAttr: without Linux's parent-death signal, children are stopped by the
// supervisor's own shutdown only.
func childProcAttr() *syscall.SysProcAttr { return nil }
