package model

// llama: Llama 1 to 3.x and the models of its shape. Its tensor names and config keys are
// the family's, which its relatives (mistral, qwen2, qwen3) take as they are.
func init() {
	register(&Arch{
		Name:      "llama",
		HFClasses: []string{"LlamaForCausalLM"},
		GGUFKeys:  llamaGGUFKeys(),
		HFKeys:    llamaHFKeys(),
		Tensors:   llamaTensors(),
		GGUFNeox:  false, // llama.cpp's converter permutes q and k to adjacent pairs
		QKVBias:   Optional,
		QKNorm:    Absent,
		Output:    Optional, // Llama 3.2 1B and 3B tie it
	})
}

// llamaGGUFKeys are the family's GGUF keys, as llama.cpp's converter writes them.
func llamaGGUFKeys() GGUFKeys {
	return GGUFKeys{
		ContextLen:        "context_length",
		Embd:              "embedding_length",
		Layers:            "block_count",
		FFN:               "feed_forward_length",
		Heads:             "attention.head_count",
		KVHeads:           "attention.head_count_kv",
		HeadDim:           "attention.key_length",
		ValueDim:          "attention.value_length",
		RopeBase:          "rope.freq_base",
		RopeDims:          "rope.dimension_count",
		NormEps:           "attention.layer_norm_rms_epsilon",
		VocabSize:         "vocab_size",
		RopeScalingType:   "rope.scaling.type",
		RopeScalingFactor: "rope.scaling.factor",
	}
}

// llamaHFKeys are the family's keys in config.json (transformers' LlamaConfig).
func llamaHFKeys() HFKeys {
	return HFKeys{
		Embd:        "hidden_size",
		Layers:      "num_hidden_layers",
		Heads:       "num_attention_heads",
		KVHeads:     "num_key_value_heads",
		HeadDim:     "head_dim",
		FFN:         "intermediate_size",
		VocabSize:   "vocab_size",
		ContextLen:  "max_position_embeddings",
		NormEps:     "rms_norm_eps",
		RopeBase:    "rope_theta",
		RopeScaling: "rope_scaling",
	}
}

// llamaTensors are the family's tensor names: llama.cpp's in GGUF, transformers' in
// safetensors.
func llamaTensors() Tensors {
	return Tensors{
		Embedding:  TensorName{"token_embd.weight", "model.embed_tokens.weight"},
		OutputNorm: TensorName{"output_norm.weight", "model.norm.weight"},
		Output:     TensorName{"output.weight", "lm_head.weight"},
		RopeFreqs:  "rope_freqs.weight",

		AttnNorm: TensorName{"blk.%d.attn_norm.weight", "model.layers.%d.input_layernorm.weight"},
		Q:        TensorName{"blk.%d.attn_q.weight", "model.layers.%d.self_attn.q_proj.weight"},
		K:        TensorName{"blk.%d.attn_k.weight", "model.layers.%d.self_attn.k_proj.weight"},
		V:        TensorName{"blk.%d.attn_v.weight", "model.layers.%d.self_attn.v_proj.weight"},
		O:        TensorName{"blk.%d.attn_output.weight", "model.layers.%d.self_attn.o_proj.weight"},
		QBias:    TensorName{"blk.%d.attn_q.bias", "model.layers.%d.self_attn.q_proj.bias"},
		KBias:    TensorName{"blk.%d.attn_k.bias", "model.layers.%d.self_attn.k_proj.bias"},
		VBias:    TensorName{"blk.%d.attn_v.bias", "model.layers.%d.self_attn.v_proj.bias"},
		QNorm:    TensorName{"blk.%d.attn_q_norm.weight", "model.layers.%d.self_attn.q_norm.weight"},
		KNorm:    TensorName{"blk.%d.attn_k_norm.weight", "model.layers.%d.self_attn.k_norm.weight"},
		FFNNorm:  TensorName{"blk.%d.ffn_norm.weight", "model.layers.%d.post_attention_layernorm.weight"},
		Gate:     TensorName{"blk.%d.ffn_gate.weight", "model.layers.%d.mlp.gate_proj.weight"},
		Up:       TensorName{"blk.%d.ffn_up.weight", "model.layers.%d.mlp.up_proj.weight"},
		Down:     TensorName{"blk.%d.ffn_down.weight", "model.layers.%d.mlp.down_proj.weight"},
	}
}
