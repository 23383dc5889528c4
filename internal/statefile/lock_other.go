//go:build !unix

package statefile

import "os"

// No advisory locks here: Lock claims nothing.
func tryLock(*os.File) (bool, error) { return true, nil }

func unlock(*os.File) {}
