package cpu

// cpuRelax tells the core that the caller is spinning (PAUSE), which saves
// power and frees the pipeline for other work on the core.
//
//go:noescape
func cpuRelax()
