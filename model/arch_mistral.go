package model

// mistral: Mistral 7B and its kin, llama's shape under a name of its own. (Sliding-window
// attention, which Mistral 7B v0.1 declares, is not implemented: attention spans the whole
// context.)
func init() {
	register(&Arch{
		Name:      "mistral",
		HFClasses: []string{"MistralForCausalLM"},
		GGUFKeys:  llamaGGUFKeys(),
		HFKeys:    llamaHFKeys(),
		Tensors:   llamaTensors(),
		GGUFNeox:  false, // converted as llama is
		QKVBias:   Optional,
		QKNorm:    Absent,
		Output:    Optional,
	})
}
