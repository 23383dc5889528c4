//go:build linux || darwin || freebsd || netbsd || openbsd

package filehash

import (
	"os"
	"syscall"
)

// fileIdentity returns f's device, inode, size and times; known is false where the
// platform does not give them.
func fileIdentity(f *os.File) (id identity, known bool) {
	fi, err := f.Stat()
	if err != nil {
		return identity{}, false
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return identity{}, false
	}
	mt, ct := statTimes(st)
	return identity{Dev: uint64(st.Dev), Ino: uint64(st.Ino), Size: fi.Size(), MtimeNs: mt, CtimeNs: ct}, true
}
