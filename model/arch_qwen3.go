package model

// qwen3: Qwen3 (dense), llama's shape with an RMSNorm over each head of q and k before RoPE,
// and no q, k or v biases unless a checkpoint has them (attention_bias).
func init() {
	register(&Arch{
		Name:      "qwen3",
		HFClasses: []string{"Qwen3ForCausalLM"},
		GGUFKeys:  llamaGGUFKeys(),
		HFKeys:    llamaHFKeys(),
		Tensors:   llamaTensors(),
		GGUFNeox:  true,
		QKVBias:   Optional,
		QKNorm:    Required,
		Output:    Optional,
	})
}
