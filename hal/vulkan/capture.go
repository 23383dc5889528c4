package vulkan

import (
	"math"
	"time"
	"unsafe"

	"tandem/hal"
)

// Step capture: Vulkan's form of a CUDA graph. The first step of a shape
// records the ops the model issues into a command buffer of its own, with
// every host input the ops read (token ids, positions, owning sequences,
// block tables, output rows) placed in a host-visible arena of the capture
// and the logits written to a host-visible buffer of it. A later step of the
// same shape, on the same store, writes its inputs into the arena, submits
// the same command buffer and copies the logits out: no op is issued, and
// nothing is recorded.
//
// A record stays right as long as what it points to stays: the model's
// buffers (FreeBuf drops every capture), the converted-activation scratch
// and the RoPE tables (their growth drops every capture), the block tables'
// stride (a step whose tables outgrow it records anew) and the positions the
// RoPE tables cover (likewise).

type captureKey struct {
	step  *hal.Step // one Runner's steps (each has its own buffers)
	shape hal.StepShape
	kv    hal.KVStore
}

type capture struct {
	key   captureKey
	cmd   vkHandle
	arena *buffer
	// Offsets in the arena: tokens, positions and sequences (Tokens values
	// each), output rows, then each sequence's table at stride entries.
	tokOff, posOff, seqOff, outOff, tabOff uint64
	stride                                 uint32

	logits    *buffer
	logitsDst []float32 // while recording: where EndStep copies the logits
	nLogits   int
	ropeCover int32 // positions below this have RoPE angles in the tables it reads
	dirty     bool  // reads an input a replay would not rewrite: run it once, keep nothing
	lastUse   uint64
}

// maxCaptures bounds the kept captures (the least recently replayed goes):
// prefill steps come in many shapes, and each capture holds a command
// buffer and its arena.
const maxCaptures = 64

// BeginStep replays the capture of s's shape if there is one that fits s,
// else starts recording the step's ops.
func (b *Backend) BeginStep(s *hal.Step) bool {
	b.t0, b.wait0 = time.Now(), b.waitNanos.Load()+b.submitNanos.Load()
	b.steps.Add(1)
	b.step = s
	if b.err != nil {
		return false // the ops do nothing; EndStep reports the error
	}
	maxLen := 1
	for _, t := range s.Attn.Blocks {
		maxLen = max(maxLen, len(t))
	}
	maxPos := int32(-1)
	for _, p := range s.Attn.Pos {
		maxPos = max(maxPos, p)
	}
	key := captureKey{step: s, shape: s.Shape(), kv: s.KV}
	if c := b.caps[key]; c != nil {
		if maxLen <= int(c.stride) && maxPos < c.ropeCover {
			b.writeInputs(c, s)
			if err := b.run(b.sub, c.cmd); err != nil {
				b.fail(err)
			} else {
				copy(s.Logits, unsafe.Slice((*float32)(c.logits.mapped), c.nLogits))
			}
			b.replayed = true
			b.useClock++
			c.lastUse = b.useClock
			b.replays.Add(1)
			return true
		}
		delete(b.caps, key)
		b.releaseCapture(c)
		b.drops.Add(1)
	}
	c, err := b.newCapture(key, s, maxLen)
	if err != nil {
		b.fail(err)
		return false
	}
	b.writeInputs(c, s)
	if err := b.beginCmd(c.cmd, false); err != nil {
		b.fail(err)
		b.freeCapture(c)
		return false
	}
	b.rec, b.xqUsed = c, false
	for _, t := range b.ropes {
		t.recUsed = false
	}
	return false
}

// EndStep runs the recorded step (a replayed one has run), copies its
// logits out and keeps the record for the shape's next step.
func (b *Backend) EndStep() error {
	defer func() {
		b.hostNanos.Add(int64(time.Since(b.t0)) - (b.waitNanos.Load() + b.submitNanos.Load() - b.wait0))
		b.step, b.replayed = nil, false
	}()
	c := b.rec
	if b.replayed || c == nil {
		return b.err
	}
	b.rec = nil
	if b.cur == c.cmd {
		if err := b.endCmd(); err != nil {
			b.fail(err)
		}
	}
	if b.err == nil {
		if err := b.run(b.sub, c.cmd); err != nil {
			b.fail(err)
		} else if c.logitsDst != nil {
			copy(c.logitsDst, unsafe.Slice((*float32)(c.logits.mapped), c.nLogits))
		}
	}
	b.afterRun()
	if b.err != nil || c.dirty || b.opts.NoReplay {
		b.releaseCapture(c)
		return b.err
	}
	c.logitsDst = nil
	b.useClock++
	c.lastUse = b.useClock
	b.caps[c.key] = c
	b.captures.Add(1)
	if len(b.caps) > maxCaptures {
		var old *capture
		for _, o := range b.caps {
			if old == nil || o.lastUse < old.lastUse {
				old = o
			}
		}
		delete(b.caps, old.key)
		b.freeCapture(old)
		b.drops.Add(1)
	}
	return nil
}

// newCapture makes an empty capture for step s, its tables laid out at a
// stride of the next power of two at or above maxLen (a sequence's table
// grows by a block every BlockSize tokens; the stride then holds for many).
func (b *Backend) newCapture(key captureKey, s *hal.Step, maxLen int) (*capture, error) {
	stride := uint32(1)
	for int(stride) < maxLen {
		stride *= 2
	}
	t, o, n := uint64(len(s.Tokens)), uint64(len(s.Outputs)), uint64(len(s.Attn.Blocks))
	c := &capture{}
	tabOff := 12*t + 4*o
	need := tabOff + 4*n*uint64(stride)
	if sp := b.spare; sp != nil && sp.arena.size >= need {
		c, b.spare = sp, nil // its command buffer, arena and logits buffer, reused
	} else {
		var err error
		if c.arena, err = b.newBuffer(need, memHost); err != nil {
			return nil, err
		}
		if c.cmd, err = b.allocCmd(); err != nil {
			b.freeBuffer(c.arena)
			return nil, err
		}
	}
	*c = capture{key: key, cmd: c.cmd, arena: c.arena, logits: c.logits, stride: stride, ropeCover: math.MaxInt32,
		tokOff: 0, posOff: 4 * t, seqOff: 8 * t, outOff: 12 * t, tabOff: tabOff}
	return c, nil
}

// releaseCapture keeps c as the spare the next recording reuses (the steps
// of shapes that are not kept, every step without replay, record into the
// same command buffer and arena), or frees it if there is one.
func (b *Backend) releaseCapture(c *capture) {
	if b.spare == nil {
		b.spare = c
		return
	}
	b.freeCapture(c)
}

// writeInputs copies s's host inputs into c's arena.
func (b *Backend) writeInputs(c *capture, s *hal.Step) {
	m := c.arena.bytes()
	ints := unsafe.Slice((*int32)(unsafe.Pointer(&m[0])), len(m)/4)
	copy(ints[c.tokOff/4:], s.Tokens)
	copy(ints[c.posOff/4:], s.Attn.Pos)
	copy(ints[c.seqOff/4:], s.Attn.SeqOf)
	out := ints[c.outOff/4:]
	for i, r := range s.Outputs {
		out[i] = int32(r)
	}
	tab := ints[c.tabOff/4:]
	for i, t := range s.Attn.Blocks {
		copy(tab[i*int(c.stride):(i+1)*int(c.stride)], t)
	}
}

func (b *Backend) freeCapture(c *capture) {
	b.freeCmd(c.cmd)
	b.freeBuffer(c.arena)
	b.freeBuffer(c.logits)
	c.cmd, c.arena, c.logits = 0, nil, nil
}

// dropCaptures frees every kept capture (the buffers they read change).
func (b *Backend) dropCaptures() {
	for k, c := range b.caps {
		b.freeCapture(c)
		delete(b.caps, k)
		b.drops.Add(1)
	}
}
