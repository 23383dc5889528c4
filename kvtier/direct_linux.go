package kvtier

import "syscall"

// oDirect opens files for I/O that bypasses the page cache.
const oDirect = syscall.O_DIRECT
