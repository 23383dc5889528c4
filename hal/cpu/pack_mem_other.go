//go:build !linux

package cpu

func mapAligned(n, _ int) ([]byte, func()) { return make([]byte, n), func() {} }

// sourceReleaser releases nothing where the pages are not advised.
type sourceReleaser struct{ ok bool }

func newSourceReleaser(src []byte) sourceReleaser { return sourceReleaser{} }

func (r *sourceReleaser) upTo(n int) {}

func (r *sourceReleaser) finish() {}

func releaseRow(row, src []byte) {}

// mapKV allocates on the Go heap where the memory is not mapped by hand.
func mapKV(n int) ([]byte, func(), error) { return make([]byte, n), func() {}, nil }
