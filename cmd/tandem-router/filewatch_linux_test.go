//go:build linux

package main

import (
	"bytes"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// watchFileNames reports (on the returned channel, once) the moment a file named one of
// names appears in dir: created, or renamed into place as an atomic write does. It watches
// with inotify, so that a test can act within microseconds of the event; stop ends the
// watch. ok is false where inotify is not available.
func watchFileNames(dir string, names ...string) (appeared <-chan string, stop func(), ok bool) {
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		return nil, nil, false
	}
	if _, err := syscall.InotifyAddWatch(fd, dir, syscall.IN_CREATE|syscall.IN_MOVED_TO); err != nil {
		syscall.Close(fd)
		return nil, nil, false
	}
	f := os.NewFile(uintptr(fd), "inotify") // non-blocking: reads go through the poller, Close ends them
	ch := make(chan string, 1)
	go func() {
		defer f.Close()
		buf := make([]byte, 64<<10)
		f.SetReadDeadline(time.Now().Add(30 * time.Second)) // bounded, whatever happens
		for {
			n, err := f.Read(buf)
			if err != nil {
				return
			}
			for off := 0; off+syscall.SizeofInotifyEvent <= n; {
				ev := (*syscall.InotifyEvent)(unsafe.Pointer(&buf[off]))
				nameBytes := buf[off+syscall.SizeofInotifyEvent : off+syscall.SizeofInotifyEvent+int(ev.Len)]
				name := string(bytes.TrimRight(nameBytes, "\x00"))
				off += syscall.SizeofInotifyEvent + int(ev.Len)
				for _, want := range names {
					if name == want {
						ch <- name
						return
					}
				}
			}
		}
	}()
	return ch, func() { f.Close() }, true
}
