#!/usr/bin/env python3
"""Writes attn_group_amd64.s: the grouped-query attention kernels (see
attn_group.go).

Run from hal/cpu: python3 attngen.py > attn_group_amd64.s
and python3 attngen.py go > attn_group_decl_amd64.go (the declarations).

One kernel per (KV element type, ISA, number of query heads g). Each reads
a KV head's keys and values once for g query heads: a key vector (16 or 8
slots of one dim) or a value vector (16 or 8 columns of one position) is
loaded once and multiplied by each head's broadcast query element or
weight. Every lane of every head still runs the scalar loops' float32
operations in their order (a product rounded, then added; no FMA; the
same operand order as the per-head kernels), so the results are bit-equal
to attnScoresRef / attnAccumVRef and their F16 twins.

Queries and weights come interleaved by head (element i of head h at
qi[i*qstride+h], weight j of head h at wi[j*wstride+h]), so that each
head's broadcast is at a fixed offset from one pointer.
"""

ISAS = {
    # name: (register prefix, lanes, number of registers, max g)
    "AVX512": ("Z", 16, 31, 8),  # Z31 holds the scale
    "AVX2": ("Y", 8, 15, 4),     # Y15 holds the scale
}
ELEMS = {"F32": 4, "F16": 2}

out = []
P = out.append


def load(elem, src, dst):
    if elem == "F32":
        P(f"\tVMOVUPS {src}, {dst}")
    else:
        P(f"\tVCVTPH2PS {src}, {dst}")


def zero(r):
    if r.startswith("Z"):
        P(f"\tVPXORD {r}, {r}, {r}")
    else:
        P(f"\tVXORPS {r}, {r}, {r}")


def scores_blocks(isa, g):
    """Blocks per step of the scores kernel: as many as the registers hold."""
    rp, lanes, nreg, _ = ISAS[isa]
    vpb = 16 // lanes  # vectors per block
    for nb in (4, 2, 1):
        if vpb * nb * g + vpb * nb + 2 <= nreg:
            return nb
    raise ValueError((isa, g))


def accum_vecs(isa, g):
    """Column vectors per head in the accumulate kernel's wide chunk."""
    rp, lanes, nreg, _ = ISAS[isa]
    for c in (4, 2, 1):
        if c * g + c + 2 <= nreg:
            return c
    raise ValueError((isa, g))


def gen_scores(elem, isa, g):
    rp, lanes, nreg, _ = ISAS[isa]
    es = ELEMS[elem]
    vpb = 16 // lanes
    name = f"attnGScores{elem}{isa}x{g}"
    P(f"// func {name}(qi *float32, qstride int, hd int, k *unsafe.Pointer, offs *int32, nblk int, scale float32, out *float32, ostride int)")
    P(f"TEXT ·{name}(SB), NOSPLIT, $0-72")
    P("\tMOVQ qstride+8(FP), R13")
    P("\tSHLQ $2, R13")
    P("\tMOVQ hd+16(FP), R15")
    P("\tMOVQ k+24(FP), DX")
    P("\tMOVQ offs+32(FP), R8")
    P("\tMOVQ nblk+40(FP), BX")
    P(f"\tVBROADCASTSS scale+48(FP), {rp}{nreg}")
    P("\tMOVQ out+56(FP), DI")
    P("\tMOVQ ostride+64(FP), R14")
    P("\tSHLQ $2, R14")
    ptrs = ["R9", "R10", "R11", "R12"]
    nb0 = scores_blocks(isa, g)
    nbs = [nb for nb in (4, 2, 1) if nb <= nb0]
    for idx, nb in enumerate(nbs):
        lbl = f"{name}_b{nb}"
        nxt = f"{name}_b{nbs[idx + 1]}" if idx + 1 < len(nbs) else f"{name}_done"
        # registers: accumulators acc[b][h][v], keys key[b][v], broadcast, temp
        r = 0
        acc = []
        for b in range(nb):
            acc.append([[f"{rp}{r + h * vpb + v}" for v in range(vpb)] for h in range(g)])
            r += g * vpb
        key = []
        for b in range(nb):
            key.append([f"{rp}{r + v}" for v in range(vpb)])
            r += vpb
        bc, tmp = f"{rp}{r}", f"{rp}{r + 1}"
        assert r + 1 < nreg
        P(f"{lbl}:")
        P(f"\tCMPQ BX, ${nb}")
        P(f"\tJLT {nxt}")
        for b in range(nb):
            P(f"\tMOVLQSX {4 * b}(R8), {ptrs[b]}")
            P(f"\tLEAQ (DX)({ptrs[b]}*{es}), {ptrs[b]}")
        # Prefetch the next step's blocks (scattered in memory, so the
        # hardware prefetcher does not see them coming) while this step
        # computes: each block is 16·hd elements, hd·es/4 cache lines.
        P(f"\tCMPQ BX, ${2 * nb}")
        P(f"\tJLT {lbl}_nopf")
        for b in range(nb):
            P(f"\tMOVLQSX {4 * (nb + b)}(R8), AX")
            P(f"\tLEAQ (DX)(AX*{es}), AX")
            P("\tMOVQ R15, CX")
            if es == 2:
                P("\tSHRQ $1, CX")
            P(f"{lbl}_pf{b}:")
            P("\tPREFETCHT0 (AX)")
            P("\tADDQ $64, AX")
            P("\tDECQ CX")
            P(f"\tJNE {lbl}_pf{b}")
        P(f"{lbl}_nopf:")
        for b in range(nb):
            for h in range(g):
                for v in range(vpb):
                    zero(acc[b][h][v])
        P("\tMOVQ qi+0(FP), SI")
        P("\tMOVQ R15, CX")
        P(f"{lbl}_inner:")
        for b in range(nb):
            for v in range(vpb):
                load(elem, f"{v * lanes * es}({ptrs[b]})", key[b][v])
        for h in range(g):
            P(f"\tVBROADCASTSS {4 * h}(SI), {bc}")
            for b in range(nb):
                for v in range(vpb):
                    P(f"\tVMULPS {key[b][v]}, {bc}, {tmp}")
                    P(f"\tVADDPS {tmp}, {acc[b][h][v]}, {acc[b][h][v]}")
        P("\tADDQ R13, SI")
        for b in range(nb):
            P(f"\tADDQ ${16 * es}, {ptrs[b]}")
        P("\tDECQ CX")
        P(f"\tJNE {lbl}_inner")
        P("\tMOVQ DI, AX")
        for h in range(g):
            for b in range(nb):
                for v in range(vpb):
                    a = acc[b][h][v]
                    P(f"\tVMULPS {rp}{nreg}, {a}, {a}")
                    P(f"\tVMOVUPS {a}, {64 * b + v * lanes * 4}(AX)")
            if h + 1 < g:
                P("\tADDQ R14, AX")
        P(f"\tADDQ ${64 * nb}, DI")
        P(f"\tADDQ ${4 * nb}, R8")
        P(f"\tSUBQ ${nb}, BX")
        P(f"\tJMP {lbl}")
    P(f"{name}_done:")
    P("\tVZEROUPPER")
    P("\tRET")
    P("")


def gen_accum(elem, isa, g):
    rp, lanes, nreg, _ = ISAS[isa]
    es = ELEMS[elem]
    name = f"attnGAccum{elem}{isa}x{g}"
    P(f"// func {name}(o *float32, hd int, v *unsafe.Pointer, offs *int32, n int, wi *float32, wstride int)")
    P(f"TEXT ·{name}(SB), NOSPLIT, $0-56")
    P("\tMOVQ o+0(FP), R11")
    P("\tMOVQ hd+8(FP), R10")
    P("\tMOVQ v+16(FP), DX")
    P(f"\tLEAQ 0(R10*{es}), R14")  # bytes per value row
    P("\tLEAQ 0(R10*4), AX")  # bytes per output row
    P("\tMOVQ wstride+48(FP), R15")
    P("\tSHLQ $2, R15")
    P("\tXORQ R12, R12")  # column offset in a value row, bytes
    c0 = accum_vecs(isa, g)
    cs = [c for c in (4, 2, 1) if c <= c0]
    for idx, c in enumerate(cs):
        lbl = f"{name}_c{c}"
        nxt = f"{name}_c{cs[idx + 1]}" if idx + 1 < len(cs) else f"{name}_done"
        acc = [[f"{rp}{h * c + v}" for v in range(c)] for h in range(g)]
        r = g * c
        val = [f"{rp}{r + v}" for v in range(c)]
        r += c
        bc, tmp = f"{rp}{r}", f"{rp}{r + 1}"
        assert r + 1 <= nreg
        P(f"{lbl}:")
        P(f"\tCMPQ R10, ${c * lanes}")
        P(f"\tJLT {nxt}")
        for h in range(g):
            for v in range(c):
                zero(acc[h][v])
        P("\tMOVQ offs+24(FP), R8")
        P("\tMOVQ wi+40(FP), R13")
        P("\tMOVQ n+32(FP), BX")
        P(f"{lbl}_blk:")
        P("\tMOVLQSX (R8), R9")
        P(f"\tLEAQ (DX)(R9*{es}), R9")
        P("\tADDQ R12, R9")
        P("\tMOVQ $16, CX")
        P("\tCMPQ BX, CX")
        P("\tCMOVQLT BX, CX")
        P("\tSUBQ CX, BX")
        # SI: from this block's rows to those of the block two ahead (0 if
        # none), prefetched row by row while this block is summed.
        P("\tXORQ SI, SI")
        P("\tCMPQ BX, $16")
        P(f"\tJLE {lbl}_nopf")
        P("\tMOVLQSX 8(R8), SI")
        P("\tMOVLQSX (R8), DI")
        P("\tSUBQ DI, SI")
        if es == 4:
            P("\tSHLQ $2, SI")
        else:
            P("\tSHLQ $1, SI")
        P(f"{lbl}_nopf:")
        P(f"{lbl}_slot:")
        for off in range(0, c * lanes * es, 64):
            P(f"\tPREFETCHT0 {off}(R9)(SI*1)")
        for v in range(c):
            load(elem, f"{v * lanes * es}(R9)", val[v])
        for h in range(g):
            P(f"\tVBROADCASTSS {4 * h}(R13), {bc}")
            for v in range(c):
                P(f"\tVMULPS {val[v]}, {bc}, {tmp}")
                P(f"\tVADDPS {tmp}, {acc[h][v]}, {acc[h][v]}")
        P("\tADDQ R15, R13")
        P("\tADDQ R14, R9")
        P("\tDECQ CX")
        P(f"\tJNE {lbl}_slot")
        P("\tADDQ $4, R8")
        P("\tTESTQ BX, BX")
        P(f"\tJNE {lbl}_blk")
        P("\tMOVQ R11, DI")
        for h in range(g):
            for v in range(c):
                P(f"\tVMOVUPS {acc[h][v]}, {v * lanes * 4}(DI)")
            if h + 1 < g:
                P("\tADDQ AX, DI")
        P(f"\tADDQ ${c * lanes * 4}, R11")
        P(f"\tADDQ ${c * lanes * es}, R12")
        P(f"\tSUBQ ${c * lanes}, R10")
        P(f"\tJMP {lbl}")
    P(f"{name}_done:")
    P("\tVZEROUPPER")
    P("\tRET")
    P("")


import sys

if len(sys.argv) > 1 and sys.argv[1] == "go":
    P("// Code generated by attngen.py; DO NOT EDIT.")
    P("")
    P("package cpu")
    P("")
    P('import "unsafe"')
    tables = []
    for elem in ELEMS:
        for isa, (_, _, _, maxg) in ISAS.items():
            if elem == "F32" and isa == "AVX2":
                continue
            for g in range(1, maxg + 1):
                P("")
                P("//go:noescape")
                P(f"func attnGScores{elem}{isa}x{g}(qi *float32, qstride int, hd int, k unsafe.Pointer, offs *int32, nblk int, scale float32, out *float32, ostride int)")
                P("")
                P("//go:noescape")
                P(f"func attnGAccum{elem}{isa}x{g}(o *float32, hd int, v unsafe.Pointer, offs *int32, n int, wi *float32, wstride int)")
            tables.append((elem, isa, maxg))
    for elem, isa, maxg in tables:
        P("")
        P(f"var attnG{elem}{isa} = &attnGroupKernels{{")
        P(f"\tmaxG:   {maxg},")
        P(f"\telem:   {ELEMS[elem]},")
        P("\tscores: []attnGScoresAsm{" + ", ".join(f"attnGScores{elem}{isa}x{g}" for g in range(1, maxg + 1)) + "},")
        P("\taccum:  []attnGAccumAsm{" + ", ".join(f"attnGAccum{elem}{isa}x{g}" for g in range(1, maxg + 1)) + "},")
        P("}")
    print("\n".join(out))
    sys.exit(0)

P("// Code generated by attngen.py; DO NOT EDIT.")
P("")
P('#include "textflag.h"')
P("")
for elem in ELEMS:
    for isa, (_, _, _, maxg) in ISAS.items():
        if elem == "F32" and isa == "AVX2":
            continue  # the F32 store has AVX-512 kernels only, as per head
        for g in range(1, maxg + 1):
            gen_scores(elem, isa, g)
            gen_accum(elem, isa, g)
print("\n".join(out))
