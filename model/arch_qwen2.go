package model

// qwen2: Qwen2 and Qwen2.5, llama's shape with biases on the q, k and v projections.
func init() {
	register(&Arch{
		Name:      "qwen2",
		HFClasses: []string{"Qwen2ForCausalLM"},
		GGUFKeys:  llamaGGUFKeys(),
		HFKeys:    llamaHFKeys(),
		Tensors:   llamaTensors(),
		GGUFNeox:  true, // llama.cpp stores q and k unpermuted
		QKVBias:   Required,
		QKNorm:    Absent,
		Output:    Optional, // the 0.5B to 3B models tie it
	})
}
