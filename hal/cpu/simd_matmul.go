package cpu

import "tandem/hal"

// matmulRange computes out[m*n+j] for weight rows j in [lo, hi) and all
// activation rows m, with the kernels of kt. Rows go through the 4-row
// kernel four at a time and the rest through the single-row kernel, or,
// where one exists, the two-weight-row kernel for weight rows in pairs;
// all of them perform the same operations per (m, j), so the split does
// not show in the result.
func matmulRange(kt *kernelTable, typ hal.DType, k, n, rows int, w []byte, wrb int, xq []byte, xrb int, out []float32, lo, hi int, wb *workerBufs) {
	var dot dotFunc
	var dot4 dot4Func
	var dot2 dot2Func
	if int(typ) < len(kt.dot) {
		dot, dot4, dot2 = kt.dot[typ], kt.dot4[typ], kt.dot2[typ]
	}
	if dot == nil {
		dot = func(n int, w, x []byte) float32 { return vecDotRef(typ, n, w, x) }
	}
	r4, r2 := &wb.r4, &wb.r2
	j := lo
	if dot2 != nil {
		for ; j+2 <= hi; j += 2 {
			wpair := w[j*wrb : (j+2)*wrb]
			m := 0
			if dot4 != nil {
				for ; m+4 <= rows; m += 4 {
					for jj := j; jj < j+2; jj++ {
						dot4(k, w[jj*wrb:(jj+1)*wrb], xq[m*xrb:(m+4)*xrb], xrb, r4)
						out[m*n+jj] = r4[0]
						out[(m+1)*n+jj] = r4[1]
						out[(m+2)*n+jj] = r4[2]
						out[(m+3)*n+jj] = r4[3]
					}
				}
			}
			for ; m < rows; m++ {
				dot2(k, wpair, wrb, xq[m*xrb:(m+1)*xrb], r2)
				out[m*n+j] = r2[0]
				out[m*n+j+1] = r2[1]
			}
		}
	}
	for ; j < hi; j++ {
		wrow := w[j*wrb : (j+1)*wrb]
		m := 0
		if dot4 != nil {
			for ; m+4 <= rows; m += 4 {
				dot4(k, wrow, xq[m*xrb:(m+4)*xrb], xrb, r4)
				out[m*n+j] = r4[0]
				out[(m+1)*n+j] = r4[1]
				out[(m+2)*n+j] = r4[2]
				out[(m+3)*n+j] = r4[3]
			}
		}
		for ; m < rows; m++ {
			out[m*n+j] = dot(k, wrow, xq[m*xrb:(m+1)*xrb])
		}
	}
}

// workerBufs are a worker's fixed result buffers for the kernels: passed
// through function values they would escape if declared per call.
type workerBufs struct {
	r4  [4]float32
	r2  [2]float32
	tmp [4 * packRows]float32
}
