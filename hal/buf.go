package hal

// Buf is a float32 array in a backend's memory, or a range of one: a forward step's
// activations. A host backend (hal/cpu) keeps the values in host memory, and HostBuf wraps a
// slice as a Buf; a device backend names its own memory with an ID of its choosing and an
// offset (DeviceBuf), and a Buf of it has no host values, so activations stay on the device
// from op to op. A Buf is a small value, passed and sliced by value: a view costs nothing and
// allocates nothing.
type Buf struct {
	host []float32
	dev  uint64
	off  int
	n    int
}

// HostBuf is the Buf of the host values v.
func HostBuf(v []float32) Buf { return Buf{host: v, n: len(v)} }

// DeviceBuf is a Buf of n values at the start of a device backend's allocation id.
func DeviceBuf(id uint64, n int) Buf { return Buf{dev: id, n: n} }

// Len is the number of values.
func (b Buf) Len() int { return b.n }

// Host returns the values of a host buffer, nil for a device one.
func (b Buf) Host() []float32 { return b.host }

// Device returns a device buffer's allocation and the offset of its first value in it.
func (b Buf) Device() (id uint64, off int) { return b.dev, b.off }

// Slice is the view of values lo..hi-1 of b.
func (b Buf) Slice(lo, hi int) Buf {
	if lo < 0 || hi < lo || hi > b.n {
		panic("hal: Buf.Slice out of range")
	}
	if b.host != nil {
		return Buf{host: b.host[lo:hi:hi], n: hi - lo}
	}
	return Buf{dev: b.dev, off: b.off + lo, n: hi - lo}
}
