//go:build !linux

package kvtier

// oDirect is 0 where O_DIRECT does not exist: files use the page cache.
const oDirect = 0
