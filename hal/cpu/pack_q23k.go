package cpu

import "math"

// Packed Q3_K and Q2_K: sub-blocks of 16 quants, 2 or 3 bits each, against
// Q8_K. A sub-block's int32 sum Σcode·x fits in an int16 (|Σ| ≤ 16·7·128),
// so the kernels keep the two sub-blocks 2i and 2i+1 of a pair in one
// int32 lane: sub-block 2i's sum, shifted up 16 bits, plus sub-block
// 2i+1's; as words that is (Σ_2i+1, Σ_2i), which one VPDPWSSD multiplies
// by the rows' scale pairs (sc_2i+1, sc_2i) and adds to the int32 isum,
// exactly. The codes stay as compact as in the source (114 and 84 bytes a
// row and super-block against 110 and 84), so a decode step reads about
// as many bytes as the row kernels do.

// packQ3_K lays out one 16-row group of Q3_K rows: per super-block, the
// rows' FP16 d (32 bytes); the signed scales (already minus 32) as byte
// pairs, rows' (sc_2i+1, sc_2i) at 32+32i; then, for each 4-byte chunk
// j < 8, the 16 rows' hmask bytes 4j..4j+3 (64 bytes at 288+128j) and
// their qs bytes 4j..4j+3 of the first half (64 bytes at 352+128j), and
// after those the qs chunks of the second half (64 bytes at 1312+64j).
// The codes are the unsigned 3-bit q+4: the low two bits from qs, bit 2
// the hmask bit; the kernels subtract 4·Σx per sub-block (sideQ3_K).
func packQ3_K(dst []byte, src [][]byte, nb int) {
	const gbb = 1824
	dst = dst[:gbb*nb]
	clear(dst)
	for b := range nb {
		d := dst[gbb*b : gbb*(b+1)]
		for r, row := range src {
			blk := row[110*b : 110*b+110]
			d[2*r], d[2*r+1] = blk[108], blk[109]
			sc := q3Scales((*[12]byte)(blk[96:108]))
			for i := range 8 {
				d[32+32*i+2*r] = byte(int8(sc[2*i+1]))
				d[32+32*i+2*r+1] = byte(int8(sc[2*i]))
			}
			for j := range 8 {
				copy(d[288+128*j+4*r:288+128*j+4*r+4], blk[4*j:4*j+4])
				copy(d[352+128*j+4*r:352+128*j+4*r+4], blk[32+4*j:32+4*j+4])
				copy(d[1312+64*j+4*r:1312+64*j+4*r+4], blk[64+4*j:64+4*j+4])
			}
		}
	}
}

// q23kBias is what the kernels add to the low word of a sub-block pair's
// sum (packgen.py's q23kBias): with it, the low word is in 0..32767, where
// the high word's bits are sub-block 2i's sum exactly (with a negative low
// word they would be one less). The kernels subtract bias·sc_2i+1 again.
const q23kBias = 16384

// sideQ3_K writes, for each Q8_K super-block of the activation row xq, the
// float32 scale and, for each pair i of sub-blocks, the int32
// q23kBias + c_2i+1 + c_2i·65536 with c_g = −4·(sum of sub-block g's
// quants): added to a pair's lane it subtracts the codes' offset of 4 from
// both words and adds the bias to the low one (12 words a block).
func sideQ3_K(side []int32, xq []byte, nb int, _ int32) {
	side = side[:12*nb]
	for i := range nb {
		yd, _, bs := q8K(xq[292*i:])
		o := side[12*i : 12*i+12]
		o[0] = int32(math.Float32bits(yd))
		for p := range 8 {
			o[1+p] = q23kBias - 4*bsum(bs, 2*p+1) + -4*bsum(bs, 2*p)*65536
		}
		o[9], o[10], o[11] = 0, 0, 0
	}
}

// packQ2_K lays out one 16-row group of Q2_K rows: per super-block, the
// rows' FP16 d (32 bytes) and dmin (32 bytes); the scale bytes (4-bit
// scale low, 4-bit min high) as pairs, rows' (sc_2i+1, sc_2i) at 64+32i;
// then the qs bytes 4j..4j+3 of half h of the 16 rows (64 bytes at
// 320+512h+64j).
func packQ2_K(dst []byte, src [][]byte, nb int) {
	const gbb = 1344
	dst = dst[:gbb*nb]
	clear(dst)
	for b := range nb {
		d := dst[gbb*b : gbb*(b+1)]
		for r, row := range src {
			blk := row[84*b : 84*b+84]
			d[2*r], d[2*r+1] = blk[80], blk[81]
			d[32+2*r], d[32+2*r+1] = blk[82], blk[83]
			for i := range 8 {
				d[64+32*i+2*r], d[64+32*i+2*r+1] = blk[2*i+1], blk[2*i]
			}
			for h := range 2 {
				for j := range 8 {
					o := 320 + 512*h + 64*j + 4*r
					copy(d[o:o+4], blk[16+32*h+4*j:16+32*h+4*j+4])
				}
			}
		}
	}
}

// sideQ2_K writes, for each Q8_K super-block of the activation row xq, the
// float32 scale and the int16 pairs (p_2i+1, p_2i), p_g the sum of
// sub-block g's quants, which the kernels multiply with the rows' min
// pairs (12 words a block).
func sideQ2_K(side []int32, xq []byte, nb int, _ int32) {
	side = side[:12*nb]
	for i := range nb {
		yd, _, bs := q8K(xq[292*i:])
		o := side[12*i : 12*i+12]
		o[0] = int32(math.Float32bits(yd))
		for p := range 8 {
			o[1+p] = int32(uint32(uint16(int16(bsum(bs, 2*p+1)))) | uint32(uint16(int16(bsum(bs, 2*p))))<<16)
		}
		o[9], o[10], o[11] = 0, 0, 0
	}
}
