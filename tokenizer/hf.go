package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Pre-tokenizer regexes used by Hugging Face tokenizer.json files that we implement.
const (
	hfPatternLlama3 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	hfPatternQwen2  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	hfPatternGPT2   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

type hfAddedToken struct {
	ID      int    `json:"id"`
	Content string `json:"content"`
	Special bool   `json:"special"`
}

type hfComponent struct {
	Type          string            `json:"type"`
	Pattern       json.RawMessage   `json:"pattern"`
	UseRegex      *bool             `json:"use_regex"`
	PrependScheme string            `json:"prepend_scheme"`
	Prepend       string            `json:"prepend"`
	Content       string            `json:"content"`
	Normalizers   []hfComponent     `json:"normalizers"`
	PreTokenizers []hfComponent     `json:"pretokenizers"`
	Single        []json.RawMessage `json:"single"`
	Processors    []hfComponent     `json:"processors"`
}

type hfTokenizerJSON struct {
	AddedTokens   []hfAddedToken `json:"added_tokens"`
	Normalizer    *hfComponent   `json:"normalizer"`
	PreTokenizer  *hfComponent   `json:"pre_tokenizer"`
	PostProcessor *hfComponent   `json:"post_processor"`
	Model         struct {
		Type         string            `json:"type"`
		Vocab        map[string]int    `json:"vocab"`
		Merges       []json.RawMessage `json:"merges"`
		ByteFallback bool              `json:"byte_fallback"`
		UnkToken     *string           `json:"unk_token"`
	} `json:"model"`
}

// flatten returns c and, for Sequence components, its members.
func (c *hfComponent) flatten() []hfComponent {
	if c == nil {
		return nil
	}
	if c.Type == "Sequence" {
		var out []hfComponent
		for i := range c.Normalizers {
			out = append(out, c.Normalizers[i].flatten()...)
		}
		for i := range c.PreTokenizers {
			out = append(out, c.PreTokenizers[i].flatten()...)
		}
		for i := range c.Processors {
			out = append(out, c.Processors[i].flatten()...)
		}
		return out
	}
	return []hfComponent{*c}
}

func (c *hfComponent) regex() string {
	var p struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	}
	if len(c.Pattern) == 0 || json.Unmarshal(c.Pattern, &p) != nil {
		return ""
	}
	if p.Regex != nil {
		return *p.Regex
	}
	if p.String != nil {
		return *p.String
	}
	return ""
}

// tokenText accepts tokenizer_config.json's token fields: a string or {"content": ...}.
func tokenText(raw json.RawMessage) string {
	if len(raw) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var o struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &o) == nil {
		return o.Content
	}
	return ""
}

type hfConfig struct {
	ChatTemplate json.RawMessage `json:"chat_template"`
	BOSToken     json.RawMessage `json:"bos_token"`
	EOSToken     json.RawMessage `json:"eos_token"`
	UnkToken     json.RawMessage `json:"unk_token"`
	PadToken     json.RawMessage `json:"pad_token"`
	AddBOSToken  *bool           `json:"add_bos_token"`
	AddEOSToken  *bool           `json:"add_eos_token"`
}

func (c *hfConfig) chatTemplate() string {
	if len(c.ChatTemplate) == 0 {
		return ""
	}
	var s string
	if json.Unmarshal(c.ChatTemplate, &s) == nil {
		return s
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if json.Unmarshal(c.ChatTemplate, &list) == nil {
		for _, e := range list {
			if e.Name == "default" {
				return e.Template
			}
		}
		if len(list) > 0 {
			return list[0].Template
		}
	}
	return ""
}

// looksSpecial mirrors convert_hf_to_gguf's test for added tokens that should be control tokens.
func looksSpecial(s string) bool {
	switch s {
	case "<pad>", "<mask>", "<2mass>", "[@BOS@]":
		return true
	}
	return (strings.HasPrefix(s, "<|") && strings.HasSuffix(s, "|>")) ||
		(strings.HasPrefix(s, "<｜") && strings.HasSuffix(s, "｜>")) ||
		(strings.HasPrefix(s, "<unused") && strings.HasSuffix(s, ">"))
}

// HFFiles are the contents of a Hugging Face tokenizer's files; only
// Tokenizer (tokenizer.json) is required.
type HFFiles struct {
	Tokenizer        []byte // tokenizer.json
	TokenizerConfig  []byte // tokenizer_config.json
	GenerationConfig []byte // generation_config.json
	Config           []byte // config.json (for vocab_size)
}

// FromHF loads a Hugging Face tokenizer directory: tokenizer.json (a BPE model),
// tokenizer_config.json (chat template, bos/eos tokens, add_bos_token) and, if
// present, generation_config.json (eos_token_id, a number or a list) and config.json
// (vocab_size, to pad the vocabulary like the GGUF converter). The result
// behaves as llama.cpp does for the same model converted to GGUF.
func FromHF(dir string) (*Tokenizer, error) {
	var files HFFiles
	for _, f := range []struct {
		name     string
		dst      *[]byte
		required bool
	}{
		{"tokenizer.json", &files.Tokenizer, true},
		{"tokenizer_config.json", &files.TokenizerConfig, false},
		{"generation_config.json", &files.GenerationConfig, false},
		{"config.json", &files.Config, false},
	} {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil && (f.required || !errors.Is(err, fs.ErrNotExist)) {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		*f.dst = b
	}
	return FromHFFiles(files)
}

// FromHFFiles builds a tokenizer from the contents of a Hugging Face
// tokenizer's files, as FromHF does from a directory.
func FromHFFiles(files HFFiles) (*Tokenizer, error) {
	vocabSize := 0
	if len(files.Config) > 0 {
		var mc struct {
			VocabSize int `json:"vocab_size"`
		}
		if json.Unmarshal(files.Config, &mc) == nil {
			vocabSize = mc.VocabSize
		}
	}
	return fromHFBytes(files.Tokenizer, files.TokenizerConfig, files.GenerationConfig, vocabSize)
}

// fromHFBytes builds a tokenizer from file contents; vocabSize (from config.json,
// 0 if unknown) pads the vocabulary with unused [PADn] tokens as the GGUF converter does.
func fromHFBytes(tokJSON, cfgJSON, genJSON []byte, vocabSize int) (*Tokenizer, error) {
	var tj hfTokenizerJSON
	if err := json.Unmarshal(tokJSON, &tj); err != nil {
		return nil, fmt.Errorf("tokenizer: tokenizer.json: %w", err)
	}
	var cfg hfConfig
	if len(bytes.TrimSpace(cfgJSON)) > 0 {
		if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
			return nil, fmt.Errorf("tokenizer: tokenizer_config.json: %w", err)
		}
	}
	var genEOS []int64
	if len(bytes.TrimSpace(genJSON)) > 0 {
		var gen struct {
			EOS json.RawMessage `json:"eos_token_id"`
		}
		if err := json.Unmarshal(genJSON, &gen); err != nil {
			return nil, fmt.Errorf("tokenizer: generation_config.json: %w", err)
		}
		var one int64
		if json.Unmarshal(gen.EOS, &one) == nil {
			genEOS = []int64{one}
		} else {
			_ = json.Unmarshal(gen.EOS, &genEOS)
		}
	}
	if tj.Model.Type != "BPE" && !(tj.Model.Type == "" && tj.Model.Vocab != nil) {
		return nil, fmt.Errorf("tokenizer: unsupported tokenizer.json model type %q (want BPE)", tj.Model.Type)
	}

	// Pre-tokenizer: byte-level (GPT-2 / Llama 3 / Qwen2) or SentencePiece-style.
	byteLevel := false
	var passes []splitPass
	preName := ""
	var unknownPatterns []string
	for _, c := range tj.PreTokenizer.flatten() {
		switch c.Type {
		case "ByteLevel":
			byteLevel = true
			if c.UseRegex == nil || *c.UseRegex {
				passes = append(passes, splitGPT2)
				if preName == "" {
					preName = "gpt-2"
				}
			}
		case "Split":
			switch c.regex() {
			case hfPatternLlama3:
				passes = append(passes, splitLlama3)
				preName = "llama-bpe"
			case hfPatternQwen2:
				passes = append(passes, splitQwen2)
				preName = "qwen2"
			case hfPatternGPT2:
				passes = append(passes, splitGPT2)
				preName = "gpt-2"
			default:
				unknownPatterns = append(unknownPatterns, c.regex())
			}
		case "Metaspace":
		default:
			return nil, fmt.Errorf("tokenizer: unsupported pre_tokenizer type %q", c.Type)
		}
	}
	if len(unknownPatterns) > 0 {
		return nil, fmt.Errorf("tokenizer: unsupported pre-tokenizer Split pattern %q", unknownPatterns[0])
	}

	if len(tj.Model.Vocab) == 0 {
		// Added tokens alone would load, and every character of every text would then
		// become <unk>.
		return nil, fmt.Errorf("tokenizer: tokenizer.json: model.vocab is missing or empty; a BPE model needs its vocabulary")
	}

	// Vocabulary with added tokens; gaps become unused [PADn] entries.
	n := 0
	for _, id := range tj.Model.Vocab {
		if id < 0 || id >= maxHFVocab {
			return nil, fmt.Errorf("tokenizer: vocab id %d out of range", id)
		}
		n = max(n, id+1)
	}
	for _, a := range tj.AddedTokens {
		if a.ID < 0 || a.ID >= maxHFVocab {
			return nil, fmt.Errorf("tokenizer: added token id %d out of range", a.ID)
		}
		n = max(n, a.ID+1)
	}
	if n == 0 {
		return nil, fmt.Errorf("tokenizer: tokenizer.json has an empty vocabulary")
	}
	if vocabSize > n && vocabSize <= maxHFVocab {
		n = vocabSize
	}
	tokens := make([]string, n)
	types := make([]int32, n)
	for i := range types {
		types[i] = -1
	}
	for s, id := range tj.Model.Vocab {
		tokens[id] = s
		types[id] = TokenTypeNormal
		if !byteLevel {
			if _, ok := parseByteToken(s); ok {
				types[id] = TokenTypeByte
			}
		}
	}
	for _, a := range tj.AddedTokens {
		tokens[a.ID] = a.Content
		if a.Special || looksSpecial(a.Content) {
			types[a.ID] = TokenTypeControl
		} else {
			types[a.ID] = TokenTypeUserDefined
		}
	}
	if tj.Model.UnkToken != nil {
		if id, ok := tj.Model.Vocab[*tj.Model.UnkToken]; ok {
			types[id] = TokenTypeUnknown
		}
	}
	seen := make(map[string]int, n)
	for i := range tokens {
		if types[i] < 0 {
			tokens[i] = fmt.Sprintf("[PAD%d]", i)
			types[i] = TokenTypeUnused
		}
		if j, dup := seen[tokens[i]]; dup {
			return nil, fmt.Errorf("tokenizer: duplicate token %q (ids %d and %d)", tokens[i], j, i)
		}
		seen[tokens[i]] = i
	}

	merges := make([]string, 0, len(tj.Model.Merges))
	for i, raw := range tj.Model.Merges {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			merges = append(merges, s)
			continue
		}
		var pair []string
		if json.Unmarshal(raw, &pair) == nil && len(pair) == 2 {
			merges = append(merges, pair[0]+" "+pair[1])
			continue
		}
		return nil, fmt.Errorf("tokenizer: merges[%d] is neither \"a b\" nor [a, b]", i)
	}

	md := MapMetadata{
		"tokenizer.ggml.tokens":     tokens,
		"tokenizer.ggml.token_type": types,
	}
	idOf := func(raw json.RawMessage) (int64, bool) {
		s := tokenText(raw)
		if s == "" {
			return 0, false
		}
		id, ok := seen[s]
		return int64(id), ok
	}
	if id, ok := idOf(cfg.BOSToken); ok {
		md["tokenizer.ggml.bos_token_id"] = uint32(id)
	}
	if id, ok := idOf(cfg.EOSToken); ok {
		md["tokenizer.ggml.eos_token_id"] = uint32(id)
	} else if len(genEOS) > 0 && genEOS[0] >= 0 && genEOS[0] < int64(n) {
		md["tokenizer.ggml.eos_token_id"] = uint32(genEOS[0])
	}
	if id, ok := idOf(cfg.UnkToken); ok {
		md["tokenizer.ggml.unknown_token_id"] = uint32(id)
	} else if tj.Model.UnkToken != nil {
		if id, ok := seen[*tj.Model.UnkToken]; ok {
			md["tokenizer.ggml.unknown_token_id"] = uint32(id)
		}
	}
	if id, ok := idOf(cfg.PadToken); ok {
		md["tokenizer.ggml.padding_token_id"] = uint32(id)
	}
	if cfg.AddBOSToken != nil {
		md["tokenizer.ggml.add_bos_token"] = *cfg.AddBOSToken
	} else if v, ok := postProcessorAddsBOS(tj.PostProcessor); ok {
		md["tokenizer.ggml.add_bos_token"] = v
	}
	if cfg.AddEOSToken != nil {
		md["tokenizer.ggml.add_eos_token"] = *cfg.AddEOSToken
	}
	if tmpl := cfg.chatTemplate(); tmpl != "" {
		md["tokenizer.chat_template"] = tmpl
	}

	var t *Tokenizer
	var err error
	if byteLevel {
		if len(passes) == 0 {
			return nil, fmt.Errorf("tokenizer: ByteLevel pre-tokenizer without a known splitting regex")
		}
		md["tokenizer.ggml.model"] = "gpt2"
		md["tokenizer.ggml.pre"] = preName
		md["tokenizer.ggml.merges"] = merges
		t, err = fromGGUFWithEOG(md, genEOS)
		if err != nil {
			return nil, err
		}
		if len(passes) > 1 {
			t.pre.passes = passes
		}
	} else {
		// SentencePiece-style BPE (Llama 2 / Mistral): spaces as U+2581, byte fallback.
		md["tokenizer.ggml.model"] = "llama"
		addPrefix := false
		for _, c := range tj.Normalizer.flatten() {
			switch c.Type {
			case "Prepend":
				if c.Prepend == "\u2581" {
					addPrefix = true
				}
			case "Replace", "NFC", "NFKC", "NFD", "NFKD", "Strip":
			default:
				return nil, fmt.Errorf("tokenizer: unsupported normalizer type %q", c.Type)
			}
		}
		for _, c := range tj.PreTokenizer.flatten() {
			if c.Type == "Metaspace" && (c.PrependScheme == "first" || c.PrependScheme == "always") {
				addPrefix = true
			}
		}
		md["tokenizer.ggml.add_space_prefix"] = addPrefix
		t, err = fromGGUFWithEOG(md, genEOS)
		if err != nil {
			return nil, err
		}
		t.merges = newMergeTable(merges, func(m string) int {
			if p := strings.IndexByte(m, ' '); p > 0 {
				return p
			}
			return -1
		}, t.tokenToID)
		t.spmMerges = true
	}
	t.hfBOSText = tokenText(cfg.BOSToken)
	t.hfEOSText = tokenText(cfg.EOSToken)
	t.compactTexts()
	return t, nil
}

func fromGGUFWithEOG(md MapMetadata, genEOS []int64) (*Tokenizer, error) {
	t, err := fromGGUF(md)
	if err != nil {
		return nil, err
	}
	if len(genEOS) > 0 {
		for _, id := range genEOS {
			if id >= 0 && id < int64(t.VocabSize()) {
				t.extraEOGFromHF = append(t.extraEOGFromHF, int32(id))
			}
		}
		t.finishSpecials()
		t.buildPieces()
	}
	return t, nil
}

// postProcessorAddsBOS reports whether a TemplateProcessing post-processor puts a
// special token before the sequence ($A).
func postProcessorAddsBOS(pp *hfComponent) (bool, bool) {
	for _, c := range pp.flatten() {
		if c.Type != "TemplateProcessing" {
			continue
		}
		if len(c.Single) == 0 {
			return false, true
		}
		var first map[string]json.RawMessage
		if json.Unmarshal(c.Single[0], &first) != nil {
			return false, true
		}
		_, special := first["SpecialToken"]
		return special, true
	}
	return false, false
}

// maxHFVocab bounds token ids accepted from tokenizer.json (real vocabularies are < 300k).
const maxHFVocab = 1 << 21
