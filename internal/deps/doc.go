// Package deps holds the project's dependency policy as a test, in the manner of Go's
// go/build/deps_test.go: which of our packages may import which, and what the pure cores
// and the router binary must never link.
package deps
