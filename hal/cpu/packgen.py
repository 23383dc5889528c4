#!/usr/bin/env python3
"""Writes pack_amd64.s: the packed-weight VNNI kernels (see pack.go).

Run from hal/cpu: python3 packgen.py > pack_amd64.s
Each kernel is unrolled over the 8 four-quant steps of a 32-quant block;
the formats differ in how a step's 16 rows x 4 unsigned codes are formed
and in the order of the per-block float operations (the reference's).
"""

FORMATS = {
    # name: (group block bytes, decode, float tail, header bytes, activation block bytes)
    "Q8_0": (544, "q8", "d_first", 32, 34),   # sum += float32(s) * (dw*dx)
    "Q5_0": (352, "q5", "d_first", 32, 34),   # sum += (dw*dx) * float32(s)
    "Q4_0": (288, "q4", "s_first", 32, 34),   # sum += (float32(s)*dw) * dx
    # against Q8_1: sum += (dw*dx)*float32(s) + mw*sx
    "Q4_1": (320, "q4", "min", 64, 36),
    "Q5_1": (384, "q5", "min", 64, 36),
}


out = []
P = out.append


def prefetch_part(name, part, reg):
    """In a PF kernel: unless pf (in reg) is nil, prefetch part bytes of the
    next group at reg and advance it, once per block, so that the calls of
    a 16-row step fetch the whole next group while they compute (the
    hardware prefetcher alone leaves the compute-bound kernels waiting on
    memory at the start of each group)."""
    P(f"\tTESTQ {reg}, {reg}")
    P(f"\tJEQ {name}_nopf")
    for c in range(0, part, 64):
        P(f"\tPREFETCHT0 {c}({reg})")
    if part % 64:
        P(f"\tPREFETCHT0 {part-1}({reg})")  # the line holding the last byte
    P(f"\tADDQ ${part}, {reg}")
    P(f"{name}_nopf:")


def loop_head(name, M):
    """Zero the M sums and open the block loop (skipped when nb is 0)."""
    for m in range(M):
        P(f"\tVPXORD Z{m}, Z{m}, Z{m}")
    P("\tTESTQ CX, CX")
    P(f"\tJEQ {name}_done")
    P(f"{name}_loop:")


def store_tail(name, M, label=True):
    """Store the M sums (Z0..) to out, row m at out + m·ostride, and return
    (after the label name_done, unless the caller wrote it)."""
    if label:
        P(f"{name}_done:")
    if M > 1:
        P("\tMOVQ out+48(FP), AX\n\tMOVQ ostride+56(FP), BX\n\tLEAQ (BX)(BX*2), DX")
        oa = ["(AX)", "(AX)(BX*1)", "(AX)(BX*2)", "(AX)(DX*1)"]
        for m in range(M):
            if m > 0 and m % 4 == 0:
                P("\tLEAQ (AX)(BX*4), AX")
            P(f"\tVMOVUPS Z{m}, {oa[m % 4]}")
    else:
        P("\tMOVQ out+32(FP), AX\n\tVMOVUPS Z0, (AX)")
    P("\tVZEROUPPER\n\tRET\n")


def signature4(name, pf):
    """The declaration of a kernel for several activation rows (packKernel4,
    or packKernel4PF with pf)."""
    if pf:
        P(f"// func {name}(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int, pf *byte)")
        P(f"TEXT ·{name}(SB), NOSPLIT, $0-72")
    else:
        P(f"// func {name}(nb int, w, x *byte, xstride int, side *byte, sstride int, out *float32, ostride int)")
        P(f"TEXT ·{name}(SB), NOSPLIT, $0-64")


def head4(name, pf):
    """The x4 kernels' signature and argument loads; x4PF adds pf."""
    signature4(name, pf)
    P("\tMOVQ nb+0(FP), CX\n\tMOVQ w+8(FP), SI\n\tMOVQ x+16(FP), DI\n\tMOVQ xstride+24(FP), R8\n\tLEAQ (R8)(R8*2), R9\n\tMOVQ side+32(FP), R10\n\tMOVQ sstride+40(FP), R11\n\tLEAQ (R11)(R11*2), R12")
    if pf:
        P("\tMOVQ pf+64(FP), R13")


def head(name, M, pf):
    """The signature and argument loads of an x4 (or x4PF) or x1 kernel;
    returns the addresses of the activation rows and of their side rows."""
    if M == 4:
        head4(name, pf)
    else:
        P(f"// func {name}(nb int, w, x, side *byte, out *float32)")
        P(f"TEXT ·{name}(SB), NOSPLIT, $0-40")
        P("\tMOVQ nb+0(FP), CX\n\tMOVQ w+8(FP), SI\n\tMOVQ x+16(FP), DI\n\tMOVQ side+24(FP), R10")
    xa = ["(DI)", "(DI)(R8*1)", "(DI)(R8*2)", "(DI)(R9*1)"]
    sa = ["(R10)", "(R10)(R11*1)", "(R10)(R11*2)", "(R10)(R12*1)"]
    return xa, sa


def steps(dec, P, hdr=32, xq=2):
    """Emit code leaving step k's codes in Z16+k; return x byte offsets.
    hdr: bytes of scales before the codes; xq: offset of the activation
    block's quants."""
    xo = []
    if dec == "q8":
        for k in range(8):
            P(f"\tVMOVDQU32 {32+64*k}(SI), Z{16+k}")
            xo.append(2 + 4 * k)
        return xo
    # 4-bit codes: step t (0..3) low nibbles of bytes 4t..4t+3 -> quants
    # 4t..4t+3; step 4+t high nibbles -> quants 16+4t...
    if dec == "q5":
        P(f"\tVMOVDQU32 {hdr+256}(SI), Z28")
    for t in range(4):
        P(f"\tVMOVDQU32 {hdr+64*t}(SI), Z{24+t}")
    for s in range(8):
        t = s % 4
        dst = f"Z{16+s}"
        if s < 4:
            src = f"Z{24+t}"
        else:
            P(f"\tVPSRLW $4, Z{24+t}, Z29")
            src = "Z29"
        if dec == "q4":
            P(f"\tVPANDD Z12, {src}, {dst}")
        else:
            # high bit of step s, byte i sits at bit 8i+s of the row's word
            if s < 4:
                P(f"\tVPSLLD ${4-s}, Z28, {dst}")
            elif s > 4:
                P(f"\tVPSRLD ${s-4}, Z28, {dst}")
            else:
                P(f"\tVMOVDQA32 Z28, {dst}")
            P(f"\tVPANDD Z13, {dst}, {dst}")
            P(f"\tVPTERNLOGD $0xF8, Z12, {src}, {dst}")  # dst |= src & 0x0F
        xo.append(xq + 4 * t + (16 if s >= 4 else 0))
    return xo


def kernel(fmt, M, pf=False):
    gbb, dec, tail, hdr, xbs = FORMATS[fmt]
    name = f"pack{fmt}x{M}{'PF' if pf else ''}VNNI"
    xa, sa = head(name, M, pf)
    if dec != "q8":
        P("\tMOVL $0x0f0f0f0f, AX\n\tVPBROADCASTD AX, Z12\n\tMOVL $0x10101010, AX\n\tVPBROADCASTD AX, Z13")
    loop_head(name, M)
    if pf:
        prefetch_part(name, gbb // 4, "R13")
    for m in range(M):
        P(f"\tVPXORD Z{4+m}, Z{4+m}, Z{4+m}")
    if M == 1:
        P("\tVPXORD Z8, Z8, Z8")
    xo = steps(dec, P, hdr, xbs - 32)
    for k in range(8):
        for m in range(M):
            acc = 4 + m
            if M == 1 and k % 2 == 1:
                acc = 8  # a second chain; exact int32 sums, added below
            P(f"\tVPDPBUSD.BCST {xo[k]}{xa[m]}, Z{16+k}, Z{acc}")
    if M == 1:
        P("\tVPADDD Z8, Z4, Z4")
    P("\tVCVTPH2PS (SI), Z10")
    if tail == "min":
        P("\tVCVTPH2PS 32(SI), Z9")
    for m in range(M):
        a = 4 + m
        if tail == "min":
            P(f"\tVCVTDQ2PS Z{a}, Z{a}")
            P(f"\tVMULPS.BCST {sa[m]}, Z10, Z11")   # dd = dw*dx
            P(f"\tVMULPS Z11, Z{a}, Z{a}")         # dd*s
            P(f"\tVMULPS.BCST 4{sa[m]}, Z9, Z14")  # mw*sx
            P(f"\tVADDPS Z14, Z{a}, Z{a}")
            P(f"\tVADDPS Z{a}, Z{m}, Z{m}")
            continue
        P(f"\tVPSUBD.BCST 4{sa[m]}, Z{a}, Z{a}")
        P(f"\tVCVTDQ2PS Z{a}, Z{a}")
        if tail == "d_first":
            P(f"\tVMULPS.BCST {sa[m]}, Z10, Z11")
            P(f"\tVMULPS Z11, Z{a}, Z{a}")
        else:
            P(f"\tVMULPS Z10, Z{a}, Z{a}")
            P(f"\tVMULPS.BCST {sa[m]}, Z{a}, Z{a}")
        P(f"\tVADDPS Z{a}, Z{m}, Z{m}")
    P(f"\tADDQ ${gbb}, SI\n\tADDQ ${xbs}, DI\n\tADDQ $8, R10\n\tDECQ CX\n\tJNE {name}_loop")
    store_tail(name, M)


def kernel_q4k(M, q5=False, pf=False):
    """Q4_K (or, with q5, Q5_K) super-blocks (256 quants) against Q8_K rows;
    layouts in pack.go."""
    gbb = 2880 if q5 else 2368
    name = f"pack{'Q5_K' if q5 else 'Q4_K'}x{M}{'PF' if pf else ''}VNNI"
    xa, sa = head(name, M, pf)
    P("\tMOVL $0x0f0f0f0f, AX\n\tVPBROADCASTD AX, Z22")
    if q5:
        P("\tMOVL $0x10101010, AX\n\tVPBROADCASTD AX, Z27")
    loop_head(name, M)
    if pf:
        prefetch_part(name, gbb // 4, "R13")
    # isum Z4..Z7, alo Z8..Z11, ahi Z12..Z15
    for m in range(M):
        P(f"\tVPXORD Z{4+m}, Z{4+m}, Z{4+m}")
    for c in range(4):
        for m in range(M):
            P(f"\tVPXORD Z{8+m}, Z{8+m}, Z{8+m}")
            P(f"\tVPXORD Z{12+m}, Z{12+m}, Z{12+m}")
        for t in range(8):
            w, lo, hi = (16, 17, 18) if t % 2 == 0 else (19, 20, 21)
            P(f"\tVMOVDQU32 {320+512*c+64*t}(SI), Z{w}")
            if not q5:
                P(f"\tVPANDD Z22, Z{w}, Z{lo}")
                P(f"\tVPSRLW $4, Z{w}, Z{hi}")
                P(f"\tVPANDD Z22, Z{hi}, Z{hi}")
            else:
                # the 5th bits: qh bit 2c (low nibbles), 2c+1 (high), to bit 4
                P(f"\tVMOVDQU32 {2368+64*t}(SI), Z28")
                for dst, bit in ((lo, 2*c), (hi, 2*c+1)):
                    if bit < 4:
                        P(f"\tVPSLLD ${4-bit}, Z28, Z{dst}")
                    elif bit > 4:
                        P(f"\tVPSRLD ${bit-4}, Z28, Z{dst}")
                    else:
                        P(f"\tVMOVDQA32 Z28, Z{dst}")
                    P(f"\tVPANDD Z27, Z{dst}, Z{dst}")
                P(f"\tVPTERNLOGD $0xF8, Z22, Z{w}, Z{lo}")
                P(f"\tVPSRLW $4, Z{w}, Z{w}")
                P(f"\tVPTERNLOGD $0xF8, Z22, Z{w}, Z{hi}")
            for m in range(M):
                P(f"\tVPDPBUSD.BCST {4+64*c+4*t}{xa[m]}, Z{lo}, Z{8+m}")
                P(f"\tVPDPBUSD.BCST {4+64*c+32+4*t}{xa[m]}, Z{hi}, Z{12+m}")
        P(f"\tVPMOVZXBD {64+16*(2*c)}(SI), Z23")
        P(f"\tVPMOVZXBD {64+16*(2*c+1)}(SI), Z24")
        for m in range(M):
            P(f"\tVPMULLD Z23, Z{8+m}, Z{8+m}")
            P(f"\tVPMULLD Z24, Z{12+m}, Z{12+m}")
            P(f"\tVPADDD Z{8+m}, Z{4+m}, Z{4+m}")
            P(f"\tVPADDD Z{12+m}, Z{4+m}, Z{4+m}")
    # mins: msum in Z8.. (int16 pairs of mins x pairs of bsum sums)
    for m in range(M):
        P(f"\tVPXORD Z{8+m}, Z{8+m}, Z{8+m}")
    for i in range(4):
        P(f"\tVPMOVZXBW {192+32*i}(SI), Z23")
        for m in range(M):
            P(f"\tVPDPWSSD.BCST {4+4*i}{sa[m]}, Z23, Z{8+m}")
    P("\tVCVTPH2PS (SI), Z23")    # d of the rows
    P("\tVCVTPH2PS 32(SI), Z24")  # dmin of the rows
    for m in range(M):
        P(f"\tVMULPS.BCST {sa[m]}, Z23, Z25")   # d = dw*yd
        P(f"\tVCVTDQ2PS Z{4+m}, Z{4+m}")
        P(f"\tVMULPS Z25, Z{4+m}, Z{4+m}")
        P(f"\tVADDPS Z{4+m}, Z{m}, Z{m}")       # sum += d*isum
        P(f"\tVMULPS.BCST {sa[m]}, Z24, Z26")   # dmin = dminw*yd
        P(f"\tVCVTDQ2PS Z{8+m}, Z{8+m}")
        P(f"\tVMULPS Z26, Z{8+m}, Z{8+m}")
        P(f"\tVSUBPS Z{8+m}, Z{m}, Z{m}")       # sum -= dmin*msum
    P(f"\tADDQ ${gbb}, SI\n\tADDQ $292, DI\n\tADDQ $32, R10\n\tDECQ CX\n\tJNE {name}_loop")
    store_tail(name, M)


def q6k_region(h, l4):
    """Start of the 768 bytes of codes that steps (h, l4 in 4q..4q+3) read,
    laid out in the order the kernels read them, so that the hardware
    prefetcher sees one forward stream (pack.go packQ6_K)."""
    return 288 + 768 * (2 * h + l4 // 4)


def q6k_ql(h, j):
    """Offset of ql chunk j (0..15) of half h: chunks 0..7 interleave with
    the qh chunks, 8..15 follow them."""
    l4 = j % 8
    if j < 8:
        return q6k_region(h, l4) + 128 * (l4 % 4)
    return q6k_region(h, l4) + 512 + 64 * (l4 % 4)


def q6k_qh(h, l4):
    """Offset of qh chunk l4 (0..7) of half h."""
    return q6k_region(h, l4) + 128 * (l4 % 4) + 64


def kernel_q6k(M, pf=False):
    """Q6_K super-blocks (256 quants, 16 groups of 16) against Q8_K rows."""
    gbb = 3360
    name = f"packQ6_Kx{M}{'PF' if pf else ''}VNNI"
    xa, sa = head(name, M, pf)
    P("\tMOVL $0x0f0f0f0f, AX\n\tVPBROADCASTD AX, Z30\n\tMOVL $0x30303030, AX\n\tVPBROADCASTD AX, Z31")
    loop_head(name, M)
    if pf:
        prefetch_part(name, gbb // 4, "R13")
    for m in range(M):
        P(f"\tVPXORD Z{4+m}, Z{4+m}, Z{4+m}")   # isum
    # group accumulators: Z8+m (first k of the pair), Z12+m (second)
    for h in range(2):
        for q in range(2):          # l4 in 4q..4q+3
            for ab in range(2):     # 0: ql[l] -> k=1 (low), k=3 (high); 1: ql[l+32] -> k=2, k=4
                ks = (1, 3) if ab == 0 else (2, 4)
                for m in range(M):
                    P(f"\tVPXORD Z{8+m}, Z{8+m}, Z{8+m}")
                    P(f"\tVPXORD Z{12+m}, Z{12+m}, Z{12+m}")
                for l4 in range(4*q, 4*q+4):
                    P(f"\tVMOVDQU32 {q6k_ql(h, 8*ab+l4)}(SI), Z16")   # ql chunk
                    P(f"\tVMOVDQU32 {q6k_qh(h, l4)}(SI), Z17")        # qh chunk
                    # code bits 4-5 from qh bits 2(k-1)..2(k-1)+1
                    for n, k in enumerate(ks):
                        code = 18 + n
                        sh = 2 * (k - 1)          # qh bit position
                        if sh < 4:
                            P(f"\tVPSLLD ${4-sh}, Z17, Z{code}")
                        elif sh > 4:
                            P(f"\tVPSRLD ${sh-4}, Z17, Z{code}")
                        else:
                            P(f"\tVMOVDQA32 Z17, Z{code}")
                        P(f"\tVPANDD Z31, Z{code}, Z{code}")
                        if n == 0:
                            src = "Z16"
                        else:
                            P("\tVPSRLW $4, Z16, Z20")
                            src = "Z20"
                        P(f"\tVPTERNLOGD $0xF8, Z30, {src}, Z{code}")  # code |= src & 0x0F
                    for m in range(M):
                        for n, k in enumerate(ks):
                            xoff = 4 + 128*h + 32*(k-1) + 4*l4
                            P(f"\tVPDPBUSD.BCST {xoff}{xa[m]}, Z{18+n}, Z{8+4*n+m}")
                for n, k in enumerate(ks):
                    G = 8*h + 2*(k-1) + q
                    P(f"\tVPMOVSXBD {32+16*G}(SI), Z21")
                    for m in range(M):
                        a = 8 + 4*n + m
                        P(f"\tVPSUBD.BCST {4+4*G}{sa[m]}, Z{a}, Z{a}")
                        P(f"\tVPMULLD Z21, Z{a}, Z{a}")
                        P(f"\tVPADDD Z{a}, Z{4+m}, Z{4+m}")
    P("\tVCVTPH2PS (SI), Z23")
    for m in range(M):
        P(f"\tVMULPS.BCST {sa[m]}, Z23, Z25")   # d = dw*yd
        P(f"\tVCVTDQ2PS Z{4+m}, Z{4+m}")
        P(f"\tVMULPS Z25, Z{4+m}, Z{4+m}")
        P(f"\tVADDPS Z{4+m}, Z{m}, Z{m}")
    P(f"\tADDQ ${gbb}, SI\n\tADDQ $292, DI\n\tADDQ $80, R10\n\tDECQ CX\n\tJNE {name}_loop")
    store_tail(name, M)



def kernel_q23k(M, q3, pf=False):
    """Q3_K (q3) or Q2_K super-blocks (256 quants, 16 sub-blocks of 16)
    against Q8_K rows; layouts and the pair trick in pack_q23k.go. For each
    half h and code k (bits 2k..2k+1 of the qs bytes), acc[k] sums the
    sub-block pair i = 4h+k: sub-block 2i over the first 16 bytes of the
    half (chunks 0..3), shifted up 16 bits, then 2i+1 over chunks 4..7,
    then the bias B = q23kBias in the low word (Q3_K's side pair has it),
    which keeps the low word in 0..32767: so the high word is sub-block
    2i's sum exactly, not one less when 2i+1's is negative. corr sums
    B·sc_2i+1 over the pairs (the same for every activation row), which
    isum then loses."""
    gbb = 1824 if q3 else 1344
    name = f"pack{'Q3_K' if q3 else 'Q2_K'}x{M}{'PF' if pf else ''}VNNI"
    xa, sa = head(name, M, pf)
    # Q3_K: sum Z0.., isum Z4.., scale pair Z8, corr Z9, acc Z10+4k+m, Q
    # Z26, H Z27, code Z28 (and Z29), masks 0x03 Z30, 0x04 Z31.
    # Q2_K: sum Z0.., isum Z4.., summs Z8.., acc Z12+4k+m, Q Z28, code Z29,
    # corr Z30, mask 0x03 Z31.
    accb = 10 if q3 else 12
    m3 = "Z30" if q3 else "Z31"
    corr = "Z9" if q3 else "Z30"
    P(f"\tMOVL $0x03030303, AX\n\tVPBROADCASTD AX, {m3}")
    if q3:
        P("\tMOVL $0x04040404, AX\n\tVPBROADCASTD AX, Z31")
    loop_head(name, M)
    if pf:
        prefetch_part(name, gbb // 4, "R13")
    P(f"\tVPXORD {corr}, {corr}, {corr}")
    for m in range(M):
        P(f"\tVPXORD Z{4+m}, Z{4+m}, Z{4+m}")
        if not q3:
            P(f"\tVPXORD Z{8+m}, Z{8+m}, Z{8+m}")
    acc = lambda k, m: f"Z{accb+4*k+m}"
    for h in range(2):
        for k in range(4):
            for m in range(M):
                P(f"\tVPXORD {acc(k, m)}, {acc(k, m)}, {acc(k, m)}")
        for j in range(8):
            if q3:
                qoff = 352 + 128 * j if h == 0 else 1312 + 64 * j
                P(f"\tVMOVDQU32 {qoff}(SI), Z26")
                P(f"\tVMOVDQU32 {288+128*j}(SI), Z27")
                Q = "Z26"
            else:
                P(f"\tVMOVDQU32 {320+512*h+64*j}(SI), Z28")
                Q = "Z28"
            t = "Z28" if q3 else "Z29"
            for k in range(4):
                if k == 0:
                    P(f"\tVPANDD {m3}, {Q}, {t}")
                else:
                    P(f"\tVPSRLW ${2*k}, {Q}, {t}")
                    P(f"\tVPANDD {m3}, {t}, {t}")
                if q3:
                    s = 4 * h + k - 2  # the hmask bit of (h, k) to bit 2
                    hsrc = "Z29"
                    if s < 0:
                        P(f"\tVPSLLW ${-s}, Z27, Z29")
                    elif s > 0:
                        P(f"\tVPSRLW ${s}, Z27, Z29")
                    else:
                        hsrc = "Z27"
                    P(f"\tVPTERNLOGD $0xF8, Z31, {hsrc}, {t}")  # t |= hbit
                for m in range(M):
                    P(f"\tVPDPBUSD.BCST {4+128*h+32*k+4*j}{xa[m]}, {t}, {acc(k, m)}")
            if j == 3:
                for k in range(4):
                    for m in range(M):
                        P(f"\tVPSLLD $16, {acc(k, m)}, {acc(k, m)}")
        for k in range(4):
            i = 4 * h + k
            if q3:
                P(f"\tVPMOVSXBW {32+32*i}(SI), Z8")
                P("\tVPDPWSSD.BCST q23kBias<>(SB), Z8, Z9")
                for m in range(M):
                    P(f"\tVPADDD.BCST {4+4*i}{sa[m]}, {acc(k, m)}, {acc(k, m)}")
                    P(f"\tVPDPWSSD Z8, {acc(k, m)}, Z{4+m}")
            else:
                P(f"\tVPMOVZXBW {64+32*i}(SI), Z28")
                P("\tVPANDD.BCST q2kScaleMask<>(SB), Z28, Z29")  # scale pairs
                P("\tVPSRLW $4, Z28, Z28")                       # min pairs
                P("\tVPDPWSSD.BCST q23kBias<>(SB), Z29, Z30")
                for m in range(M):
                    P(f"\tVPADDD.BCST q23kBias<>(SB), {acc(k, m)}, {acc(k, m)}")
                    P(f"\tVPDPWSSD Z29, {acc(k, m)}, Z{4+m}")
                    P(f"\tVPDPWSSD.BCST {4+4*i}{sa[m]}, Z28, Z{8+m}")
    for m in range(M):
        P(f"\tVPSUBD {corr}, Z{4+m}, Z{4+m}")
    if q3:
        P("\tVCVTPH2PS (SI), Z8")
        for m in range(M):
            P(f"\tVMULPS.BCST {sa[m]}, Z8, Z9")       # d = dw*yd
            P(f"\tVCVTDQ2PS Z{4+m}, Z{4+m}")
            P(f"\tVMULPS Z9, Z{4+m}, Z{4+m}")
            P(f"\tVADDPS Z{4+m}, Z{m}, Z{m}")
    else:
        P("\tVCVTPH2PS (SI), Z28\n\tVCVTPH2PS 32(SI), Z29")
        for m in range(M):
            P(f"\tVMULPS.BCST {sa[m]}, Z28, Z30")     # dall = yd*dw
            P(f"\tVCVTDQ2PS Z{4+m}, Z{4+m}")
            P(f"\tVMULPS Z30, Z{4+m}, Z{4+m}")
            P(f"\tVMULPS.BCST {sa[m]}, Z29, Z30")     # dmin = yd*dminw
            P(f"\tVCVTDQ2PS Z{8+m}, Z{8+m}")
            P(f"\tVMULPS Z30, Z{8+m}, Z{8+m}")
            P(f"\tVSUBPS Z{8+m}, Z{4+m}, Z{4+m}")     # dall*isum − dmin*summs
            P(f"\tVADDPS Z{4+m}, Z{m}, Z{m}")
    P(f"\tADDQ ${gbb}, SI\n\tADDQ $292, DI\n\tADDQ $48, R10\n\tDECQ CX\n\tJNE {name}_loop")
    store_tail(name, M)


def side_f16():
    """The F16 side row: n (a multiple of 16) FP16 values widened to float32,
    exactly (VCVTPH2PS), 64 at a time, then 16 at a time."""
    name = "sideF16AVX512"
    P(f"// func {name}(n int, src *byte, dst *int32)")
    P(f"TEXT ·{name}(SB), NOSPLIT, $0-24")
    P("\tMOVQ n+0(FP), CX\n\tMOVQ src+8(FP), SI\n\tMOVQ dst+16(FP), DI")
    P(f"{name}_loop4:\n\tCMPQ CX, $64\n\tJLT {name}_loop1")
    for i in range(4):
        P(f"\tVCVTPH2PS {32*i}(SI), Z{i}")
    for i in range(4):
        P(f"\tVMOVUPS Z{i}, {64*i}(DI)")
    P(f"\tADDQ $128, SI\n\tADDQ $256, DI\n\tSUBQ $64, CX\n\tJMP {name}_loop4")
    P(f"{name}_loop1:\n\tTESTQ CX, CX\n\tJEQ {name}_done")
    P("\tVCVTPH2PS (SI), Z0\n\tVMOVUPS Z0, (DI)")
    P(f"\tADDQ $32, SI\n\tADDQ $64, DI\n\tSUBQ $16, CX\n\tJMP {name}_loop1")
    P(f"{name}_done:\n\tVZEROUPPER\n\tRET\n")


F16_BASES = ["R10", "R13", "DI", "R8"]  # side-row base registers, 4 rows each


def kernel_f16(M, pf=False, f32=False):
    """F16 rows: per output, the exact float32 products summed in float32 in
    column order (one lane per row; FMA is exact here as the products are).
    M activation rows (up to 16) share each widened weight vector, each
    row its own accumulator: M independent FMA chains against the FMA's
    latency of 4 cycles (Zen 4 issues one 512-bit FMA a cycle). With pf,
    unless pf is nil, each block also prefetches M/16 of a block of the next
    group at pf, so that the calls of a 16-row step fetch all of it while
    they compute. With f32, F32 rows the same way: one FMA a product, which
    is not rounded as the reference rounds it (the reference rounds each
    product and sums in float64)."""
    gbb = 1024 if f32 else 512
    name = f"pack{'F32' if f32 else 'F16'}x{M}{'PF' if pf else ''}AVX512"
    # F16 broadcasts the side rows (the activation widened to float32);
    # F32 (f32) the activation rows themselves.
    xrow = "MOVQ x+16(FP), R10\n\tMOVQ xstride+24(FP), R11" if f32 else "MOVQ side+32(FP), R10\n\tMOVQ sstride+40(FP), R11"
    if M > 1:
        signature4(name, pf)
        P(f"\tMOVQ nb+0(FP), CX\n\tMOVQ w+8(FP), SI\n\t{xrow}\n\tLEAQ (R11)(R11*2), R12")
        if pf:
            P("\tMOVQ pf+64(FP), R9")
        # rows 4q..4q+3 hang off base register q
        for q in range(1, (M + 3) // 4):
            P(f"\tLEAQ ({F16_BASES[q-1]})(R11*4), {F16_BASES[q]}")
    else:
        P(f"// func {name}(nb int, w, x, side *byte, out *float32)")
        P(f"TEXT ·{name}(SB), NOSPLIT, $0-40")
        P(f"\tMOVQ nb+0(FP), CX\n\tMOVQ w+8(FP), SI\n\tMOVQ {'x+16' if f32 else 'side+24'}(FP), R10")
    sa = [f"({F16_BASES[m // 4]}){['', '(R11*1)', '(R11*2)', '(R12*1)'][m % 4]}" for m in range(M)]
    loop_head(name, M)
    if pf:
        prefetch_part(name, gbb * M // 16, "R9")
    for k in range(16):
        w = 16 + k % 8
        P(f"\tVMOVUPS {64*k}(SI), Z{w}" if f32 else f"\tVCVTPH2PS {32*k}(SI), Z{w}")
        for m in range(M):
            P(f"\tVFMADD231PS.BCST {4*k}{sa[m]}, Z{w}, Z{m}")
    P(f"\tADDQ ${gbb}, SI\n\tADDQ $64, R10")
    for q in range(1, (M + 3) // 4):
        P(f"\tADDQ $64, {F16_BASES[q]}")
    P(f"\tDECQ CX\n\tJNE {name}_loop")
    store_tail(name, M)


REGS = {"AX": 0, "CX": 1, "DX": 2, "BX": 3, "SP": 4, "BP": 5, "SI": 6, "DI": 7,
        **{f"R{i}": i for i in range(8, 16)}}


def vdpbf16ps(dst, src1, base, disp=0, index=None, scale=1):
    """VDPBF16PS with a broadcast 32-bit memory operand (Go's assembler has
    no AVX512_BF16 mnemonics), as BYTEs: Zdst += pairwise products of Zsrc1
    and the BF16 pair at disp(base)(index*scale) in every lane. EVEX.512.F3.0F38.W0 52 /r,
    SIB addressing, disp8 scaled by the element size 4 when it fits."""
    b, x = REGS[base], REGS[index] if index else 4  # SIB index 100: none
    p0 = (((~dst >> 3) & 1) << 7 | ((~x >> 3) & 1) << 6 | ((~b >> 3) & 1) << 5 |
          ((~dst >> 4) & 1) << 4 | 0b10)
    p1 = ((~src1) & 0xF) << 3 | 1 << 2 | 0b10
    p2 = 0b10 << 5 | 1 << 4 | ((~src1 >> 4) & 1) << 3
    sib = {1: 0, 2: 1, 4: 2, 8: 3}[scale] << 6 | (x & 7) << 3 | (b & 7)
    if disp % 4 == 0 and -128 <= disp // 4 <= 127:
        tail = [0x40 | (dst & 7) << 3 | 4, sib, (disp // 4) & 0xFF]
    else:
        tail = [0x80 | (dst & 7) << 3 | 4, sib] + list((disp & 0xFFFFFFFF).to_bytes(4, "little"))
    bs = [0x62, p0, p1, p2, 0x52] + tail
    mem = f"{disp}({base})" + (f"({index}*{scale})" if index else "")
    return "\t" + "; ".join(f"BYTE ${v:#04x}" for v in bs) + f" // VDPBF16PS.BCST {mem}, Z{src1}, Z{dst}"


BF16_BASES = ["R10", "R13"]  # activation-row base registers, 4 rows each


def kernel_bf16(M, pf=False):
    """BF16 rows (AVX512_BF16): VDPBF16PS multiplies a column pair of 16
    rows by the activation row's BF16 pair broadcast and adds both exact
    products to the row's float32 lane. Each activation row keeps two sums,
    of the even and of the odd column pairs, added at the end: the same
    operations in the same order in every kernel, so an output does not
    depend on how many rows were computed together; M rows give 2M
    independent chains against the instruction's latency. The activation
    rows are read in place (x, xstride), with no side row. pf as in
    kernel_f16."""
    gbb = 512
    name = f"packBF16x{M}{'PF' if pf else ''}AVX512"
    if M > 1:
        signature4(name, pf)
        P("\tMOVQ nb+0(FP), CX\n\tMOVQ w+8(FP), SI\n\tMOVQ x+16(FP), R10\n\tMOVQ xstride+24(FP), R11\n\tLEAQ (R11)(R11*2), R12")
        if pf:
            P("\tMOVQ pf+64(FP), R9")
        if M > 4:
            P("\tLEAQ (R10)(R11*4), R13")
    else:
        P(f"// func {name}(nb int, w, x, side *byte, out *float32)")
        P(f"TEXT ·{name}(SB), NOSPLIT, $0-40")
        P("\tMOVQ nb+0(FP), CX\n\tMOVQ w+8(FP), SI\n\tMOVQ x+16(FP), R10")
    xa = [(BF16_BASES[m // 4], [None, "R11", "R11", "R12"][m % 4], [1, 1, 2, 1][m % 4]) for m in range(M)]
    for m in range(M):
        P(f"\tVPXORD Z{8+m}, Z{8+m}, Z{8+m}")
    loop_head(name, M)
    if pf:
        prefetch_part(name, gbb * M // 16, "R9")
    for k in range(8):
        w = 16 + k
        P(f"\tVMOVDQU32 {64*k}(SI), Z{w}")
        for m in range(M):
            base, index, scale = xa[m]
            P(vdpbf16ps(m + 8 * (k % 2), w, base, 4 * k, index, scale))
    P(f"\tADDQ ${gbb}, SI\n\tADDQ $32, R10")
    if M > 4:
        P("\tADDQ $32, R13")
    P(f"\tDECQ CX\n\tJNE {name}_loop")
    P(f"{name}_done:")
    for m in range(M):
        P(f"\tVADDPS Z{8+m}, Z{m}, Z{m}")
    store_tail(name, M, label=False)


def kernel_float_avx2(kind, M):
    """F16, BF16 and F32 rows with AVX2 only (one FMA unit's 8 lanes): the
    packed layouts of the AVX-512 kernels, each 16-row group as two 8-row
    halves. Per output, one float32 FMA chain in column order (F16 and
    BF16 products are exact, so F16 keeps the reference's bits); the
    activation values come from the side rows (F16, BF16: widened to
    float32) or, for F32, the rows themselves. M rows (1 or 4) each keep two
    accumulators (the halves): with 4 rows, the 8 chains the FMAs' latency
    needs. BF16 widens a column pair of 8 rows at once: even columns by a
    shift, odd ones by a mask."""
    gbb = {"F16": 512, "BF16": 512, "F32": 1024}[kind]
    name = f"pack{kind}x{M}AVX2"
    if kind == "F32":
        xrow, xrow1 = "MOVQ x+16(FP), R10\n\tMOVQ xstride+24(FP), R11", "MOVQ x+16(FP), R10"
    else:
        xrow, xrow1 = "MOVQ side+32(FP), R10\n\tMOVQ sstride+40(FP), R11", "MOVQ side+24(FP), R10"
    if M > 1:
        signature4(name, False)
        P(f"\tMOVQ nb+0(FP), CX\n\tMOVQ w+8(FP), SI\n\t{xrow}\n\tLEAQ (R11)(R11*2), R12")
    else:
        P(f"// func {name}(nb int, w, x, side *byte, out *float32)")
        P(f"TEXT ·{name}(SB), NOSPLIT, $0-40")
        P(f"\tMOVQ nb+0(FP), CX\n\tMOVQ w+8(FP), SI\n\t{xrow1}")
    xa = ["(R10)", "(R10)(R11*1)", "(R10)(R11*2)", "(R10)(R12*1)"]
    for m in range(M):
        P(f"\tVXORPS Y{m}, Y{m}, Y{m}\n\tVXORPS Y{4+m}, Y{4+m}, Y{4+m}")
    if kind == "BF16":
        P("\tVPCMPEQD Y15, Y15, Y15\n\tVPSLLD $16, Y15, Y15")  # 0xFFFF0000: the odd column of a pair
    P(f"\tTESTQ CX, CX\n\tJEQ {name}_done\n{name}_loop:")
    if kind == "BF16":
        for p in range(8):
            P(f"\tVMOVDQU {64*p}(SI), Y10\n\tVMOVDQU {64*p+32}(SI), Y11")
            P("\tVPSLLD $16, Y10, Y8\n\tVPAND Y15, Y10, Y10\n\tVPSLLD $16, Y11, Y9\n\tVPAND Y15, Y11, Y11")
            for m in range(M):
                P(f"\tVBROADCASTSS {8*p}{xa[m]}, Y12")
                P(f"\tVFMADD231PS Y12, Y8, Y{m}\n\tVFMADD231PS Y12, Y9, Y{4+m}")
                P(f"\tVBROADCASTSS {8*p+4}{xa[m]}, Y13")
                P(f"\tVFMADD231PS Y13, Y10, Y{m}\n\tVFMADD231PS Y13, Y11, Y{4+m}")
    else:
        for k in range(16):
            if kind == "F16":
                P(f"\tVCVTPH2PS {32*k}(SI), Y8\n\tVCVTPH2PS {32*k+16}(SI), Y9")
            else:
                P(f"\tVMOVUPS {64*k}(SI), Y8\n\tVMOVUPS {64*k+32}(SI), Y9")
            for m in range(M):
                P(f"\tVBROADCASTSS {4*k}{xa[m]}, Y12")
                P(f"\tVFMADD231PS Y12, Y8, Y{m}\n\tVFMADD231PS Y12, Y9, Y{4+m}")
    P(f"\tADDQ ${gbb}, SI\n\tADDQ $64, R10\n\tDECQ CX\n\tJNE {name}_loop")
    P(f"{name}_done:")
    if M > 1:
        P("\tMOVQ out+48(FP), AX\n\tMOVQ ostride+56(FP), BX\n\tLEAQ (BX)(BX*2), DX")
        oa = ["(AX)", "(AX)(BX*1)", "(AX)(BX*2)", "(AX)(DX*1)"]
        for m in range(M):
            P(f"\tVMOVUPS Y{m}, {oa[m]}\n\tVMOVUPS Y{4+m}, 32{oa[m]}")
    else:
        P("\tMOVQ out+32(FP), AX\n\tVMOVUPS Y0, (AX)\n\tVMOVUPS Y4, 32(AX)")
    P("\tVZEROUPPER\n\tRET\n")


P("""// Code generated by packgen.py; DO NOT EDIT.

#include "textflag.h"

// Packed-weight kernels (AVX-512 VNNI); layouts in pack.go. Activation
// rows are Q8_0 (34 bytes a block); side rows hold per block the float32
// scale dx and the int32 correction (code offset)·Σx. Per block and lane:
// s = Σ VPDPBUSD − correction (exact), then the reference's float32
// operations in its order, without FMA.

// The low word pair 0x000F000F: the Q2_K kernels' 4-bit scales of a
// sub-block pair.
DATA q2kScaleMask<>+0(SB)/4, $0x000f000f
GLOBL q2kScaleMask<>(SB), RODATA|NOPTR, $4

// The bias the Q3_K and Q2_K kernels add to the low word of a sub-block
// pair's sum (16384 low, 0 high): see kernel_q23k.
DATA q23kBias<>+0(SB)/4, $0x00004000
GLOBL q23kBias<>(SB), RODATA|NOPTR, $4
""")
for f in FORMATS:
    kernel(f, 4, pf=True)
    kernel(f, 4)
    kernel(f, 1)
kernel_q4k(4, pf=True)
kernel_q4k(4)
kernel_q4k(1)
kernel_q4k(4, q5=True, pf=True)
kernel_q4k(4, q5=True)
kernel_q4k(1, q5=True)
kernel_q6k(4, pf=True)
kernel_q6k(4)
kernel_q6k(1)
for q3 in (True, False):
    kernel_q23k(4, q3, pf=True)
    kernel_q23k(4, q3)
    kernel_q23k(1, q3)
kernel_f16(8)
kernel_f16(8, pf=True)
kernel_f16(4)
kernel_f16(1)
kernel_f16(8, f32=True)
kernel_f16(8, pf=True, f32=True)
kernel_f16(4, f32=True)
kernel_f16(1, f32=True)
kernel_bf16(8)
kernel_bf16(8, pf=True)
kernel_bf16(4)
kernel_bf16(1)
for kind in ("F16", "BF16", "F32"):
    kernel_float_avx2(kind, 4)
    kernel_float_avx2(kind, 1)
side_f16()
print("\n".join(out))
