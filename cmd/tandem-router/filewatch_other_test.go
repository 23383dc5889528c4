//go:build !linux

package main

// watchFileNames needs inotify; elsewhere the tests that use it kill by delay only.
func watchFileNames(dir string, names ...string) (appeared <-chan string, stop func(), ok bool) {
	return nil, nil, false
}
