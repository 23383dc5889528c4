package cpu

// The amd64 kernels that are unrolled by program rather than by hand are written by three
// generators (python3), and their output is committed so that a build needs no Python. After
// changing a generator, run `go generate ./hal/cpu/`; CI (.ci/run) regenerates and fails if
// the committed files differ from what the generators write. This file has no build
// constraint, so the directives run on any host.

//go:generate sh -c "python3 packgen.py > pack_amd64.s"
//go:generate sh -c "python3 packgen_avx2.py > pack_avx2_amd64.s"
//go:generate sh -c "python3 attngen.py > attn_group_amd64.s"
//go:generate sh -c "python3 attngen.py go > attn_group_decl_amd64.go"
