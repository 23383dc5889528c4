package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"tandem/hal"
)

// TestAttnGroupKernelsBitEqual holds the grouped attention kernels to the
// per-head scalar loops bit for bit, under every ISA the CPU runs, over F32
// and F16 keys and values: groups of 1 to 8 query heads (passes of every
// kernel width, and groups split into passes), head sizes the models use
// and others, position counts that do and do not fill the last block, one
// position, blocks in scattered order. F16 keys and values include FP16's
// edges (subnormals, ±0, the largest finite values).
func TestAttnGroupKernelsBitEqual(t *testing.T) {
	const bs, blocks = 16, 9
	r := rand.New(rand.NewPCG(61, 62))
	tested := 0
	for _, isa := range append([]string{"go"}, simdISAs()...) {
		for _, dt := range []hal.DType{hal.F32, hal.F16} {
			for _, hd := range []int{8, 16, 24, 32, 48, 64, 80, 96, 128, 256} {
				gk := attnGroupKernelsFor(isa, dt, hd, bs)
				if gk == nil {
					continue
				}
				tested++
				k16, v16 := randKVF16(r, blocks*bs*hd, 1), randKVF16(r, blocks*bs*hd, 1)
				for _, h := range []uint16{0x0001, 0x83ff, 0x0000, 0x8000, 0x7bff, 0xfbff, 0x0400} {
					k16[r.IntN(len(k16))], v16[r.IntN(len(v16))] = h, h
				}
				k32, v32 := testRandRow(r, blocks*bs*hd), testRandRow(r, blocks*bs*hd)
				kp, vp := unsafe.Pointer(&k32[0]), unsafe.Pointer(&v32[0])
				if dt == hal.F16 {
					kp, vp = unsafe.Pointer(&k16[0]), unsafe.Pointer(&v16[0])
				}
				for G := 1; G <= 8; G++ {
					q := testRandRow(r, G*hd)
					qi := make([]float32, G*hd)
					for h := range G {
						for d := range hd {
							qi[d*G+h] = q[h*hd+d]
						}
					}
					for _, n := range []int{1, 2, 7, 8, 9, 15, 16, 17, 33, 63, 64, 65, 100, blocks * bs} {
						name := fmt.Sprintf("%s %v hd=%d G=%d n=%d", isa, dt, hd, G, n)
						nblk := (n + bs - 1) / bs
						offs := make([]int32, nblk)
						for i, p := range r.Perm(blocks)[:nblk] {
							offs[i] = int32(p * bs * hd)
						}
						stride := nblk*bs + 3 // rows apart, as a longer context's would be
						got := make([]float32, G*stride)
						gk.groupScores(qi, G, hd, kp, len(k32), offs, 0.125, got, stride)
						want := make([]float32, nblk*bs)
						for h := range G {
							if dt == hal.F16 {
								attnScoresF16Ref(q[h*hd:(h+1)*hd], k16, offs, bs, 0.125, want)
							} else {
								attnScoresRef(q[h*hd:(h+1)*hd], k32, offs, bs, 0.125, want)
							}
							for j := range want {
								if g := got[h*stride+j]; math.Float32bits(g) != math.Float32bits(want[j]) {
									t.Fatalf("%s: head %d score %d: grouped %g, scalar %g", name, h, j, g, want[j])
								}
							}
						}
						w := make([]float32, G*n)
						wi := make([]float32, G*n)
						for h := range G {
							for j := range n {
								w[h*n+j] = r.Float32()
								wi[j*G+h] = w[h*n+j]
							}
						}
						og := make([]float32, G*hd+1)
						for i := range og {
							og[i] = 99 // overwritten, not accumulated into; the last one untouched
						}
						gk.groupAccumV(og, G, hd, vp, len(v32), offs, n, wi)
						if og[G*hd] != 99 {
							t.Fatalf("%s: wrote past the group's outputs", name)
						}
						ow := make([]float32, hd)
						for h := range G {
							if dt == hal.F16 {
								attnAccumVF16Ref(ow, v16, offs, bs, w[h*n:(h+1)*n])
							} else {
								attnAccumVRef(ow, v32, offs, bs, w[h*n:(h+1)*n])
							}
							for i := range ow {
								if g := og[h*hd+i]; math.Float32bits(g) != math.Float32bits(ow[i]) {
									t.Fatalf("%s: head %d out %d: grouped %g, scalar %g", name, h, i, g, ow[i])
								}
							}
						}
					}
				}
			}
		}
	}
	if tested == 0 {
		t.Skip("no grouped attention kernels on this CPU")
	}
	t.Logf("%d kernel sets and head sizes tested", tested)
}

// TestAttentionGroupedPerHead: attention by (token, KV head) units with the
// grouped kernels gives the bits of attention one query head at a time, for
// the models' group shapes and others, F32 and F16 stores, two sequences
// in one batch, every position of each.
func TestAttentionGroupedPerHead(t *testing.T) {
	r := rand.New(rand.NewPCG(63, 64))
	be := New(2)
	defer be.Close()
	for _, c := range []struct{ hd, heads, kvHeads int }{
		{64, 14, 2}, {64, 32, 8}, {128, 8, 2}, {16, 6, 2}, {24, 5, 1}, {64, 16, 2},
	} {
		for _, dt := range []hal.DType{hal.F32, hal.F16} {
			t.Run(fmt.Sprintf("%v_hd%d_%dof%d", dt, c.hd, c.heads, c.kvHeads), func(t *testing.T) {
				if attnGroupKernelsFor(kern.isa, dt, c.hd, 16) == nil {
					t.Skipf("no grouped kernels for %v hd %d under %s", dt, c.hd, kern.isa)
				}
				const bs = 16
				batch, next := prefillBatch([]int{70, 21}, bs)
				tokens := len(batch.Pos)
				row := c.kvHeads * c.hd
				k, v := testRandRow(r, tokens*row), testRandRow(r, tokens*row)
				st, err := be.NewKVStore(hal.KVLayout{Layers: 1, Blocks: int(next), BlockSize: bs, KVHeads: c.kvHeads, HeadDim: c.hd, DType: dt})
				if err != nil {
					t.Fatal(err)
				}
				be.StoreKV(st, 0, hal.HostBuf(k), hal.HostBuf(v), batch)
				q := testRandRow(r, tokens*c.heads*c.hd)
				og, oh := make([]float32, len(q)), make([]float32, len(q))
				be.Attention(hal.HostBuf(og), hal.HostBuf(q), c.heads, 0.125, st, 0, batch)
				be.perHeadAttn = true
				be.Attention(hal.HostBuf(oh), hal.HostBuf(q), c.heads, 0.125, st, 0, batch)
				be.perHeadAttn = false
				for i := range og {
					if math.Float32bits(og[i]) != math.Float32bits(oh[i]) {
						t.Fatalf("out %d (token %d, head %d): grouped %g, per head %g", i, i/(c.heads*c.hd), i/c.hd%c.heads, og[i], oh[i])
					}
				}
			})
		}
	}
}

// benchAttnGroups (part of BenchmarkAttnKernels) times the G query heads of
// one KV head over 4096 positions: "grouped", the grouped kernels reading
// the KV head once; "perhead", the per-head kernels G times, as attention
// ran before. Bytes per op are the KV head's keys and values, read once.
// "cache": the same KV head every time; "mem": a different one each time,
// from 128 MiB of F32 KV (64 MiB of F16).
func benchAttnGroups(b *testing.B) {
	const bs, n = 16, 4096
	r := rand.New(rand.NewPCG(65, 66))
	for _, c := range []struct{ G, hd int }{{7, 64}, {4, 64}, {4, 128}} {
		for _, where := range []string{"cache", "mem"} {
			kvHeads := 1
			if where == "mem" {
				kvHeads = (128 << 20) / (n * c.hd * 8)
			}
			nblk := n / bs
			offs := make([][]int32, kvHeads)
			for h := range offs {
				offs[h] = make([]int32, nblk)
				for i, p := range r.Perm(nblk) {
					offs[h][i] = int32((h*nblk + p) * bs * c.hd)
				}
			}
			hd, G := c.hd, c.G
			q := testRandRow(r, G*hd)
			qi := testRandRow(r, G*hd)
			k32, v32 := testRandRow(r, kvHeads*n*hd), testRandRow(r, kvHeads*n*hd)
			k16, v16 := randKVF16(r, kvHeads*n*hd, 1), randKVF16(r, kvHeads*n*hd, 1)
			sc, o := make([]float32, G*n), make([]float32, G*hd)
			w := make([]float32, G*n)
			for i := range w {
				w[i] = r.Float32() / n
			}
			for _, dt := range []hal.DType{hal.F32, hal.F16} {
				kp, vp, kvLen, es := unsafe.Pointer(&k32[0]), unsafe.Pointer(&v32[0]), len(k32), 4
				if dt == hal.F16 {
					kp, vp, es = unsafe.Pointer(&k16[0]), unsafe.Pointer(&v16[0]), 2
				}
				for _, isa := range simdISAs() {
					gk := attnGroupKernelsFor(isa, dt, hd, bs)
					if gk == nil {
						continue
					}
					b.Run(fmt.Sprintf("group/%v/G%d/hd%d/%s/%s/grouped", dt, G, hd, where, isa), func(b *testing.B) {
						b.SetBytes(int64(2 * n * hd * es))
						h := 0
						for b.Loop() {
							h = (h + 1) % kvHeads
							gk.groupScores(qi, G, hd, kp, kvLen, offs[h], 0.125, sc, n)
							gk.groupAccumV(o, G, hd, vp, kvLen, offs[h], n, w)
						}
					})
					b.Run(fmt.Sprintf("group/%v/G%d/hd%d/%s/%s/perhead", dt, G, hd, where, isa), func(b *testing.B) {
						ak, ak16 := attnKernelsFor(isa, hd, bs), attnKernelsF16For(isa, hd, bs)
						if (dt == hal.F32 && ak == nil) || (dt == hal.F16 && ak16 == nil) {
							b.Skipf("no per-head kernels for %v under %s", dt, isa)
						}
						b.SetBytes(int64(2 * n * hd * es))
						h := 0
						for b.Loop() {
							h = (h + 1) % kvHeads
							for g := range G {
								qh, sh, oh, wh := q[g*hd:(g+1)*hd], sc[g*n:(g+1)*n], o[g*hd:(g+1)*hd], w[g*n:(g+1)*n]
								if dt == hal.F16 {
									ak16.scores(qh, k16, offs[h], 0.125, sh)
									ak16.accumV(oh, v16, offs[h], wh)
								} else {
									ak.scores(qh, k32, offs[h], 0.125, sh)
									ak.accumV(oh, v32, offs[h], wh)
								}
							}
						}
					})
				}
			}
		}
	}
}
