#!/usr/bin/env python3
"""Writes pack_avx2_amd64.s: the packed-weight kernels of the int8 formats
for CPUs with AVX2 and no AVX-512 (see pack.go, pack_avx2_amd64.go).

Run from hal/cpu: python3 packgen_avx2.py > pack_avx2_amd64.s

AVX2 has no VPDPBUSD: a step (4 codes of each of 8 rows, 32 bytes) is
multiplied with 4 activation bytes broadcast to every lane by VPMADDUBSW
(unsigned codes times signed activations, adjacent products summed into
int16 with saturation) and widened by VPMADDWD (by ones, or by the rows'
scales as int16 pairs). No sum here can saturate: the bounds are noted
at each format, for activations of magnitude at most 128.

A 16-row group is computed as two halves of 8 rows (the low and high 32
bytes of each 64-byte step of the VNNI layouts), one pass over the
group's blocks per half: the 16 ymm registers hold, for 4 activation
rows, the float sums (Y0..Y3), the exact int32 block sums (Y4..Y7) and
int16 partial sums (Y8..Y11), with Y12..Y15 for codes and temporaries.
Per block and lane the float operations are the reference's, in its
order, without FMA, so every output keeps the bits of vecDotRef.
"""

out = []
P = out.append

# name: (group block bytes, activation block bytes, side bytes a block)
GEOM = {
    "Q8_0": (544, 34, 68),
    "Q5_0": (352, 34, 8),
    "Q4_0": (288, 34, 8),
    "Q4_1": (320, 36, 8),
    "Q5_1": (384, 36, 8),
    "Q4_K": (2368, 292, 32),
    "Q5_K": (2880, 292, 32),
    "Q6_K": (3360, 292, 0),
}

ONES = "avx2ones<>(SB)"  # int16 ones
C0F = "avx2c0f<>(SB)"
C10 = "avx2c10<>(SB)"
C30 = "avx2c30<>(SB)"


def F(m):
    return f"Y{m}"


def I32(m):
    return f"Y{4+m}"


def A16(m):
    return f"Y{8+m}"


def load_args(M):
    if M == 4:
        P("\tMOVQ nb+0(FP), CX\n\tMOVQ w+8(FP), SI\n\tMOVQ x+16(FP), DI\n\tMOVQ xstride+24(FP), R8\n\tLEAQ (R8)(R8*2), R9\n\tMOVQ side+32(FP), R10\n\tMOVQ sstride+40(FP), R11\n\tLEAQ (R11)(R11*2), R12")
    else:
        P("\tMOVQ nb+0(FP), CX\n\tMOVQ w+8(FP), SI\n\tMOVQ x+16(FP), DI\n\tMOVQ side+24(FP), R10")


def store(M, h):
    if M == 4:
        P("\tMOVQ out+48(FP), AX\n\tMOVQ ostride+56(FP), BX\n\tLEAQ (BX)(BX*2), DX")
        oa = ["(AX)", "(AX)(BX*1)", "(AX)(BX*2)", "(AX)(DX*1)"]
        for m in range(M):
            P(f"\tVMOVUPS {F(m)}, {32*h}{oa[m]}")
    else:
        P(f"\tMOVQ out+32(FP), AX\n\tVMOVUPS Y0, {32*h}(AX)")


def shift_to(src, dst, bit, want):
    """dst = src shifted so that bit `bit` of each byte lands on bit `want`
    (32-bit lanes: the bits crossing bytes are masked off afterwards)."""
    if bit < want:
        P(f"\tVPSLLD ${want-bit}, {src}, {dst}")
    elif bit > want:
        P(f"\tVPSRLD ${bit-want}, {src}, {dst}")
    elif src != dst:
        P(f"\tVMOVDQA {src}, {dst}")


def madd_step(code, xaddr, m, first, tmp="Y13"):
    """A16[m] (+)= VPMADDUBSW(code, broadcast activation bytes at xaddr)."""
    P(f"\tVPBROADCASTD {xaddr}, {tmp}")
    if first:
        P(f"\tVPMADDUBSW {tmp}, {code}, {A16(m)}")
    else:
        P(f"\tVPMADDUBSW {tmp}, {code}, {tmp}")
        P(f"\tVPADDW {tmp}, {A16(m)}, {A16(m)}")


def flush(ms, first, by=ONES):
    """I32[m] (+)= VPMADDWD(A16[m], by): the int16 pairs summed (times the
    scales when by holds them) into int32."""
    for m in ms:
        if first:
            P(f"\tVPMADDWD {by}, {A16(m)}, {I32(m)}")
        else:
            P(f"\tVPMADDWD {by}, {A16(m)}, {A16(m)}")
            P(f"\tVPADDD {A16(m)}, {I32(m)}, {I32(m)}")


def body_q8_0(ms, h, xa, sa):
    """Q8_0 in packQ8_0AVX2's layout: code pairs of 8 rows sign-extended
    to int16 (VPMOVSXBW) times the activation's pair as int16 words from
    the side row (VPMADDWD): exact for any bytes. (VPMADDUBSW would
    saturate on 8-bit codes; the row kernels' sign trick, |w| times
    x·sign(w), measured slower: one VPSIGNB more per row and step.)"""
    for m in ms:
        P(f"\tVPXOR {I32(m)}, {I32(m)}, {I32(m)}")
    for p in range(16):
        P(f"\tVPMOVSXBW {32+32*p+16*h}(SI), Y12")
        for m in ms:
            t = A16(m)
            P(f"\tVPBROADCASTD {4+4*p}{sa[m]}, {t}")
            P(f"\tVPMADDWD {t}, Y12, {t}")
            P(f"\tVPADDD {t}, {I32(m)}, {I32(m)}")
    P(f"\tVCVTPH2PS {16*h}(SI), Y12")
    for m in ms:
        P(f"\tVBROADCASTSS {sa[m]}, Y13")
        P("\tVMULPS Y13, Y12, Y13")
        P(f"\tVCVTDQ2PS {I32(m)}, {I32(m)}")
        P(f"\tVMULPS Y13, {I32(m)}, {I32(m)}")
        P(f"\tVADDPS {I32(m)}, {F(m)}, {F(m)}")


def body_q32(fmt, ms, h, xa, sa):
    """Q4_0, Q5_0 (against Q8_0) and Q4_1, Q5_1 (against Q8_1) in their
    VNNI layouts: unsigned 4- or 5-bit codes. Pairs at most 2·15·128
    (2·31·128), so 8 steps (4 steps) sum in int16 before widening."""
    q5 = fmt in ("Q5_0", "Q5_1")
    hdr = 64 if fmt in ("Q4_1", "Q5_1") else 32
    xq = 4 if fmt in ("Q4_1", "Q5_1") else 2
    if q5:
        P(f"\tVMOVDQU {hdr+256+32*h}(SI), Y15")  # the rows' high-bit words
    chain = 4 if q5 else 8
    n = 0
    for t in range(4):
        P(f"\tVMOVDQU {hdr+64*t+32*h}(SI), Y14")
        for s in (t, t + 4):
            if s < 4:
                P(f"\tVPAND {C0F}, Y14, Y12")
            else:
                P("\tVPSRLW $4, Y14, Y12")
                P(f"\tVPAND {C0F}, Y12, Y12")
            if q5:
                # the high bit of step s, byte i, is bit 8i+s of the word
                shift_to("Y15", "Y13", s, 4)
                P(f"\tVPAND {C10}, Y13, Y13")
                P("\tVPOR Y13, Y12, Y12")
            for m in ms:
                madd_step("Y12", f"{xq+4*t+(16 if s >= 4 else 0)}{xa[m]}", m, n % chain == 0)
            n += 1
            if n % chain == 0:
                flush(ms, n == chain)
    P(f"\tVCVTPH2PS {16*h}(SI), Y12")  # dw
    if fmt in ("Q4_1", "Q5_1"):
        # sum += (dw*dx)*float32(s) + mw*sx
        P(f"\tVCVTPH2PS {32+16*h}(SI), Y15")  # mw
        for m in ms:
            P(f"\tVBROADCASTSS {sa[m]}, Y13")
            P("\tVMULPS Y13, Y12, Y13")
            P(f"\tVCVTDQ2PS {I32(m)}, {I32(m)}")
            P(f"\tVMULPS Y13, {I32(m)}, {I32(m)}")
            P(f"\tVBROADCASTSS 4{sa[m]}, Y14")
            P("\tVMULPS Y14, Y15, Y14")
            P(f"\tVADDPS Y14, {I32(m)}, {I32(m)}")
            P(f"\tVADDPS {I32(m)}, {F(m)}, {F(m)}")
        return
    for m in ms:
        P(f"\tVPBROADCASTD 4{sa[m]}, Y13")  # (code offset)·Σx
        P(f"\tVPSUBD Y13, {I32(m)}, {I32(m)}")
        P(f"\tVCVTDQ2PS {I32(m)}, {I32(m)}")
        P(f"\tVBROADCASTSS {sa[m]}, Y13")
        if fmt == "Q5_0":  # sum += (dw*dx) * float32(s)
            P("\tVMULPS Y13, Y12, Y13")
            P(f"\tVMULPS Y13, {I32(m)}, {I32(m)}")
        else:  # Q4_0: sum += (float32(s)*dw) * dx
            P(f"\tVMULPS Y12, {I32(m)}, {I32(m)}")
            P(f"\tVMULPS Y13, {I32(m)}, {I32(m)}")
        P(f"\tVADDPS {I32(m)}, {F(m)}, {F(m)}")


def scale_pairs_u8(addr, dst, tmp):
    """dst = 8 unsigned scale bytes at addr as int16 pairs (sc, sc)."""
    P(f"\tVPMOVZXBD {addr}, {dst}")
    P(f"\tVPSLLD $16, {dst}, {tmp}")
    P(f"\tVPOR {tmp}, {dst}, {dst}")


def body_qk(ms, h, xa, sa, q5):
    """Q4_K (Q5_K) in the VNNI layout against Q8_K: per sub-block j of 32
    quants, 8 steps of unsigned 4-bit codes sum in int16 (at most
    8·2·15·128; 5-bit codes: 4 steps, 4·2·31·128), widened by VPMADDWD
    with the rows' 6-bit scales as (sc, sc) pairs; the mins against the
    side row's sub-block sums as the VNNI kernels do, by VPMADDWD."""
    for m in ms:
        P(f"\tVPXOR {I32(m)}, {I32(m)}, {I32(m)}")
    chain = 4 if q5 else 8
    for c in range(4):
        for part in range(2):
            j = 2 * c + part
            scale_pairs_u8(f"{64+16*j+8*h}(SI)", "Y14", "Y13")
            for t in range(8):
                P(f"\tVMOVDQU {320+512*c+64*t+32*h}(SI), Y12")
                if part == 1:
                    P("\tVPSRLW $4, Y12, Y12")
                P(f"\tVPAND {C0F}, Y12, Y12")
                if q5:
                    P(f"\tVMOVDQU {2368+64*t+32*h}(SI), Y15")
                    shift_to("Y15", "Y15", 2 * c + part, 4)
                    P(f"\tVPAND {C10}, Y15, Y15")
                    P("\tVPOR Y15, Y12, Y12")
                for m in ms:
                    madd_step("Y12", f"{4+64*c+32*part+4*t}{xa[m]}", m, t % chain == 0)
                if t % chain == chain - 1:
                    for m in ms:
                        P(f"\tVPMADDWD Y14, {A16(m)}, {A16(m)}")
                        P(f"\tVPADDD {A16(m)}, {I32(m)}, {I32(m)}")
    # mins: msum (int32, in A16) = Σ pairs (m_2i, m_2i+1)·(p_2i, p_2i+1)
    for i in range(4):
        P(f"\tVPMOVZXBW {192+32*i+16*h}(SI), Y12")
        for m in ms:
            P(f"\tVPBROADCASTD {4+4*i}{sa[m]}, Y13")
            if i == 0:
                P(f"\tVPMADDWD Y13, Y12, {A16(m)}")
            else:
                P("\tVPMADDWD Y13, Y12, Y13")
                P(f"\tVPADDD Y13, {A16(m)}, {A16(m)}")
    P(f"\tVCVTPH2PS {16*h}(SI), Y12")     # d of the rows
    P(f"\tVCVTPH2PS {32+16*h}(SI), Y13")  # dmin of the rows
    for m in ms:
        P(f"\tVBROADCASTSS {sa[m]}, Y15")  # yd
        P("\tVMULPS Y15, Y12, Y14")         # d = dw*yd
        P(f"\tVCVTDQ2PS {I32(m)}, {I32(m)}")
        P(f"\tVMULPS Y14, {I32(m)}, {I32(m)}")
        P(f"\tVADDPS {I32(m)}, {F(m)}, {F(m)}")  # sum += d*isum
        P("\tVMULPS Y15, Y13, Y14")         # dmin = dminw*yd
        P(f"\tVCVTDQ2PS {A16(m)}, {A16(m)}")
        P(f"\tVMULPS Y14, {A16(m)}, {A16(m)}")
        P(f"\tVSUBPS {A16(m)}, {F(m)}, {F(m)}")  # sum -= dmin*msum


def q6k_region(h6, l4):
    return 288 + 768 * (2 * h6 + l4 // 4)


def q6k_ql(h6, j):
    l4 = j % 8
    if j < 8:
        return q6k_region(h6, l4) + 128 * (l4 % 4)
    return q6k_region(h6, l4) + 512 + 64 * (l4 % 4)


def q6k_qh(h6, l4):
    return q6k_region(h6, l4) + 128 * (l4 % 4) + 64


def body_q6k(ms, h, xa):
    """Q6_K in packQ6_KAVX2's layout (the VNNI one with each group's 16
    scales stored in the order rows 0-3, 8-11, 4-7, 12-15, so that
    VPMOVSXBW and VPUNPCKLWD / VPUNPCKHWD give half 0's / half 1's (sc, sc)
    pairs) against Q8_K, which the kernels read alone (its d and its
    16-element sums). Unsigned 6-bit codes: 2 steps sum in int16 (at most
    2·2·63·128), widened by VPMADDWD with the group's scale pairs; the
    codes' offset 32 comes off at the end as 32·Σ sc_G·bsum_G, by
    VPMADDWD of (sc_2i, sc_2i+1) with the activation's bsums pairs."""
    unpck = "VPUNPCKLWD" if h == 0 else "VPUNPCKHWD"
    for m in ms:
        P(f"\tVPXOR {I32(m)}, {I32(m)}, {I32(m)}")
    for h6 in range(2):
        for q in range(2):
            for ab in range(2):
                for k in ((1, 3) if ab == 0 else (2, 4)):
                    G = 8 * h6 + 2 * (k - 1) + q
                    P(f"\tVPMOVSXBW {32+16*G}(SI), Y14")
                    P(f"\t{unpck} Y14, Y14, Y14")
                    sh = 2 * (k - 1)  # the code's high bits in qh
                    high_nib = k > 2
                    for i, l4 in enumerate(range(4 * q, 4 * q + 4)):
                        P(f"\tVMOVDQU {q6k_ql(h6, 8*ab+l4)+32*h}(SI), Y12")
                        if high_nib:
                            P("\tVPSRLW $4, Y12, Y12")
                        P(f"\tVPAND {C0F}, Y12, Y12")
                        P(f"\tVMOVDQU {q6k_qh(h6, l4)+32*h}(SI), Y15")
                        shift_to("Y15", "Y15", sh, 4)
                        P(f"\tVPAND {C30}, Y15, Y15")
                        P("\tVPOR Y15, Y12, Y12")
                        xoff = 4 + 128 * h6 + 32 * (k - 1) + 4 * l4
                        for m in ms:
                            madd_step("Y12", f"{xoff}{xa[m]}", m, i % 2 == 0)
                        if i % 2 == 1:
                            for m in ms:
                                P(f"\tVPMADDWD Y14, {A16(m)}, {A16(m)}")
                                P(f"\tVPADDD {A16(m)}, {I32(m)}, {I32(m)}")
    # the offset: I32 -= 32·Σ_i (sc_2i, sc_2i+1)·(bsum_2i, bsum_2i+1)
    for i in range(8):
        P(f"\tVPMOVSXBW {32+32*i}(SI), Y12")
        P(f"\tVPMOVSXBW {48+32*i}(SI), Y13")
        P(f"\t{unpck} Y13, Y12, Y12")
        for m in ms:
            P(f"\tVPBROADCASTD {260+4*i}{xa[m]}, Y13")
            if i == 0:
                P(f"\tVPMADDWD Y13, Y12, {A16(m)}")
            else:
                P("\tVPMADDWD Y13, Y12, Y13")
                P(f"\tVPADDD Y13, {A16(m)}, {A16(m)}")
    P(f"\tVCVTPH2PS {16*h}(SI), Y12")  # d of the rows
    for m in ms:
        P(f"\tVPSLLD $5, {A16(m)}, {A16(m)}")
        P(f"\tVPSUBD {A16(m)}, {I32(m)}, {I32(m)}")
        P(f"\tVBROADCASTSS {xa[m]}, Y13")  # yd
        P("\tVMULPS Y13, Y12, Y13")         # d = dw*yd
        P(f"\tVCVTDQ2PS {I32(m)}, {I32(m)}")
        P(f"\tVMULPS Y13, {I32(m)}, {I32(m)}")
        P(f"\tVADDPS {I32(m)}, {F(m)}, {F(m)}")


def prefetch_part(lbl, part, reg):
    """Unless pf (in reg) is nil, prefetch part bytes of the next group at
    reg and advance it, once per block: as in packgen.py, the calls for
    activation rows 0-3, 4-7, 8-11 and 12-15 of a group each fetch a
    quarter of the next group while they compute."""
    P(f"\tTESTQ {reg}, {reg}")
    P(f"\tJEQ {lbl}_nopf")
    for c in range(0, part, 64):
        P(f"\tPREFETCHT0 {c}({reg})")
    if part % 64:
        P(f"\tPREFETCHT0 {part-1}({reg})")
    P(f"\tADDQ ${part}, {reg}")
    P(f"{lbl}_nopf:")


def kernel(fmt, M, pf=False):
    """A kernel for M (4 or 1) activation rows. Four rows take the group
    in two passes, one per half; one row takes both halves in one pass
    (units 0 and 1 of the registers: the group is read once, as one
    stream, which decode's speed depends on)."""
    gbb, xbs, sbs = GEOM[fmt]
    name = f"pack{fmt}x{M}{'PF' if pf else ''}AVX2"
    if pf:
        P(f"// func {name}(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)")
        P(f"TEXT ·{name}(SB), NOSPLIT, $0-72")
    elif M == 4:
        P(f"// func {name}(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)")
        P(f"TEXT ·{name}(SB), NOSPLIT, $0-64")
    else:
        P(f"// func {name}(nb int, w, x, side *byte, out *float32)")
        P(f"TEXT ·{name}(SB), NOSPLIT, $0-40")
    if M == 4:
        xa = ["(DI)", "(DI)(R8*1)", "(DI)(R8*2)", "(DI)(R9*1)"]
        sa = ["(R10)", "(R10)(R11*1)", "(R10)(R11*2)", "(R10)(R12*1)"]
        passes = [[(h, [0, 1, 2, 3])] for h in range(2)]
    else:
        xa, sa = ["(DI)"] * 2, ["(R10)"] * 2
        passes = [[(0, [0]), (1, [1])]]
    for i, halves in enumerate(passes):
        lbl = f"{name}_p{i}"
        load_args(M)
        units = [m for _, ms in halves for m in ms]
        for m in units:
            P(f"\tVXORPS {F(m)}, {F(m)}, {F(m)}")
        if pf and i == 0:
            P("\tMOVQ pf+64(FP), R13")
        P(f"\tTESTQ CX, CX\n\tJEQ {lbl}_done\n{lbl}_loop:")
        if pf and i == 0:
            # the first half's pass fetches the whole quarter
            prefetch_part(lbl, gbb // 4, "R13")
        for h, ms in halves:
            if fmt == "Q8_0":
                body_q8_0(ms, h, xa, sa)
            elif fmt in ("Q4_K", "Q5_K"):
                body_qk(ms, h, xa, sa, fmt == "Q5_K")
            elif fmt == "Q6_K":
                body_q6k(ms, h, xa)
            else:
                body_q32(fmt, ms, h, xa, sa)
        P(f"\tADDQ ${gbb}, SI\n\tADDQ ${xbs}, DI")
        if sbs:
            P(f"\tADDQ ${sbs}, R10")
        P(f"\tDECQ CX\n\tJNE {lbl}_loop\n{lbl}_done:")
        if M == 4:
            store(M, halves[0][0])
        else:
            P("\tMOVQ out+32(FP), AX\n\tVMOVUPS Y0, (AX)\n\tVMOVUPS Y1, 32(AX)")
    P("\tVZEROUPPER\n\tRET\n")


def kernel_q8_0_x1():
    """The one-row Q8_0 kernel (packQ8_0AVX2's layout) in one pass over
    the group: both halves share each broadcast pair, two int32 chains a
    half (their sum is exact)."""
    name = "packQ8_0x1AVX2"
    P(f"// func {name}(nb int, w, x, side *byte, out *float32)")
    P(f"TEXT ·{name}(SB), NOSPLIT, $0-40")
    load_args(1)
    P("\tVXORPS Y0, Y0, Y0\n\tVXORPS Y1, Y1, Y1")
    P(f"\tTESTQ CX, CX\n\tJEQ {name}_done\n{name}_loop:")
    for r in (4, 5, 6, 7):
        P(f"\tVPXOR Y{r}, Y{r}, Y{r}")
    for p in range(16):
        x = 13 if p % 2 == 0 else 14
        a, b = (8, 9) if p % 2 == 0 else (10, 11)
        P(f"\tVPBROADCASTD {4+4*p}(R10), Y{x}")
        P(f"\tVPMOVSXBW {32+32*p}(SI), Y{a}")
        P(f"\tVPMOVSXBW {32+32*p+16}(SI), Y{b}")
        P(f"\tVPMADDWD Y{x}, Y{a}, Y{a}")
        P(f"\tVPMADDWD Y{x}, Y{b}, Y{b}")
        c = 4 if p % 2 == 0 else 6
        P(f"\tVPADDD Y{a}, Y{c}, Y{c}")
        P(f"\tVPADDD Y{b}, Y{c+1}, Y{c+1}")
    P("\tVPADDD Y6, Y4, Y4\n\tVPADDD Y7, Y5, Y5")
    P("\tVCVTPH2PS (SI), Y12\n\tVCVTPH2PS 16(SI), Y14")
    P("\tVBROADCASTSS (R10), Y13")
    P("\tVMULPS Y13, Y12, Y12\n\tVMULPS Y13, Y14, Y14")  # dw*dx
    for acc, i, d in ((0, 4, 12), (1, 5, 14)):
        P(f"\tVCVTDQ2PS Y{i}, Y{i}\n\tVMULPS Y{d}, Y{i}, Y{i}\n\tVADDPS Y{i}, Y{acc}, Y{acc}")
    P(f"\tADDQ $544, SI\n\tADDQ $34, DI\n\tADDQ $68, R10\n\tDECQ CX\n\tJNE {name}_loop\n{name}_done:")
    P("\tMOVQ out+32(FP), AX\n\tVMOVUPS Y0, (AX)\n\tVMOVUPS Y1, 32(AX)")
    P("\tVZEROUPPER\n\tRET\n")


def const(name, word):
    for i in range(4):
        P(f"DATA {name}<>+{8*i}(SB)/8, ${word:#018x}")
    P(f"GLOBL {name}<>(SB), RODATA|NOPTR, $32\n")


P("""// Code generated by packgen_avx2.py; DO NOT EDIT.

#include "textflag.h"

// Packed-weight kernels of the int8 formats for AVX2 (no VPDPBUSD);
// layouts in pack.go and pack_avx2_amd64.go.
""")
const("avx2ones", 0x0001000100010001)
const("avx2c0f", 0x0F0F0F0F0F0F0F0F)
const("avx2c10", 0x1010101010101010)
const("avx2c30", 0x3030303030303030)
for f in GEOM:
    kernel(f, 4, pf=True)
    kernel(f, 4)
    if f == "Q8_0":
        kernel_q8_0_x1()
    else:
        kernel(f, 1)
print("\n".join(out))
