// Package tokenizer converts text to token ids and back for Tandem models, matching llama.cpp.
// It loads vocabularies from GGUF metadata or Hugging Face tokenizer.json and renders chat templates.
package tokenizer

import (
	"fmt"
	"slices"
	"sort"
	"strings"
)

// Metadata is the subset of a GGUF file's key/value metadata the tokenizer needs.
// Values use Go types: scalars (uint8..int64, float32, float64, bool, string) and
// typed slices for arrays ([]string, []float32, []int32, ...).
type Metadata interface {
	Get(key string) (any, bool)
}

// MapMetadata is a Metadata backed by a plain map.
type MapMetadata map[string]any

// Get implements Metadata.
func (m MapMetadata) Get(key string) (any, bool) {
	v, ok := m[key]
	return v, ok
}

// Token attributes, as llama.cpp assigns them from tokenizer.ggml.token_type.
const (
	attrUnknown     uint8 = 1 << 0
	attrUnused      uint8 = 1 << 1
	attrNormal      uint8 = 1 << 2
	attrControl     uint8 = 1 << 3
	attrUserDefined uint8 = 1 << 4
	attrByte        uint8 = 1 << 5
)

// GGUF token types (tokenizer.ggml.token_type values).
const (
	TokenTypeUndefined   = 0
	TokenTypeNormal      = 1
	TokenTypeUnknown     = 2
	TokenTypeControl     = 3
	TokenTypeUserDefined = 4
	TokenTypeUnused      = 5
	TokenTypeByte        = 6
)

type vocabKind int

const (
	kindSPM vocabKind = iota // SentencePiece-style (tokenizer.ggml.model = "llama")
	kindBPE                  // byte-level BPE (tokenizer.ggml.model = "gpt2")
)

const nullToken int32 = -1

// Tokenizer encodes and decodes text for one vocabulary. It is safe for concurrent use.
type Tokenizer struct {
	kind    vocabKind
	preName string
	pre     preTokenizer

	// tokens holds the vocabulary's texts by id or, once compact (see
	// compactTexts), only those of the ids in kept, in that order.
	tokens    stringTable
	kept      []int32
	compact   bool
	scores    []float32 // SentencePiece vocabularies only
	attrs     []uint8
	tokenToID *vocabIndex
	merges    *mergeTable
	// Piece(id) is pieces[pieceOff.at(id):pieceOff.at(id+1)]: one array
	// for the whole vocabulary instead of a slice per token (a 150k
	// vocabulary's slice headers alone took 3.5 MiB).
	pieces   []byte
	pieceOff offsets

	bos, eos, eot, eom, unk, sep, pad int32
	fimPad, fimRep, fimSep            int32

	addBOS, addEOS bool
	addSpacePrefix bool
	ignoreMerges   bool
	spmMerges      bool // SentencePiece-style BPE from tokenizer.json: merge by rank
	cleanSpaces    bool
	eog            map[int32]bool
	specials       []int32 // control/user-defined/unknown tokens, longest text first
	byteTok        [256]int32
	chatTemplate   string
	extraEOGFromHF []int32
	hfBOSText      string
	hfEOSText      string
	wordCache      wordCache
	maxTokenBytes  int // see MaxTokenBytes
}

// preTokenizer describes the llama.cpp pre-tokenizer behaviour of a BPE vocab.
type preTokenizer struct {
	passes       []splitPass
	ignoreMerges bool
	addBOS       bool // forced default (llama3 family)
	cleanSpaces  bool
	nullBOS      bool
}

func metaString(md Metadata, key string) (string, bool) {
	v, ok := md.Get(key)
	if !ok {
		return "", false
	}
	s, ok := v.(string)
	return s, ok
}

func toInt64(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint:
		return int64(x), true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		if x > 1<<62 {
			return -1, true
		}
		return int64(x), true
	case float64:
		return int64(x), true
	case float32:
		return int64(x), true
	}
	return 0, false
}

func metaInt(md Metadata, key string) (int64, bool) {
	v, ok := md.Get(key)
	if !ok {
		return 0, false
	}
	return toInt64(v)
}

func metaBool(md Metadata, key string) (bool, bool) {
	v, ok := md.Get(key)
	if !ok {
		return false, false
	}
	switch x := v.(type) {
	case bool:
		return x, true
	default:
		if n, ok := toInt64(v); ok {
			return n != 0, true
		}
	}
	return false, false
}

func metaStrings(md Metadata, key string) ([]string, bool, error) {
	v, ok := md.Get(key)
	if !ok {
		return nil, false, nil
	}
	switch x := v.(type) {
	case []string:
		return x, true, nil
	case []any:
		out := make([]string, len(x))
		for i, e := range x {
			s, ok := e.(string)
			if !ok {
				return nil, true, fmt.Errorf("tokenizer: %s[%d] is %T, want string", key, i, e)
			}
			out[i] = s
		}
		return out, true, nil
	}
	return nil, true, fmt.Errorf("tokenizer: %s is %T, want a string array", key, v)
}

func metaFloats(md Metadata, key string) ([]float32, bool, error) {
	v, ok := md.Get(key)
	if !ok {
		return nil, false, nil
	}
	switch x := v.(type) {
	case []float32:
		return x, true, nil
	case []float64:
		out := make([]float32, len(x))
		for i, f := range x {
			out[i] = float32(f)
		}
		return out, true, nil
	case []int32:
		out := make([]float32, len(x))
		for i, f := range x {
			out[i] = float32(f)
		}
		return out, true, nil
	case []any:
		out := make([]float32, len(x))
		for i, e := range x {
			switch f := e.(type) {
			case float32:
				out[i] = f
			case float64:
				out[i] = float32(f)
			default:
				n, ok := toInt64(e)
				if !ok {
					return nil, true, fmt.Errorf("tokenizer: %s[%d] is %T, want a number", key, i, e)
				}
				out[i] = float32(n)
			}
		}
		return out, true, nil
	}
	return nil, true, fmt.Errorf("tokenizer: %s is %T, want a float32 or int32 array", key, v)
}

func metaInts(md Metadata, key string) ([]int64, bool, error) {
	v, ok := md.Get(key)
	if !ok {
		return nil, false, nil
	}
	var out []int64
	switch x := v.(type) {
	case []int32:
		out = make([]int64, len(x))
		for i, n := range x {
			out[i] = int64(n)
		}
	case []uint32:
		out = make([]int64, len(x))
		for i, n := range x {
			out[i] = int64(n)
		}
	case []int64:
		out = x
	case []int:
		out = make([]int64, len(x))
		for i, n := range x {
			out[i] = int64(n)
		}
	case []uint8:
		out = make([]int64, len(x))
		for i, n := range x {
			out[i] = int64(n)
		}
	case []int8:
		out = make([]int64, len(x))
		for i, n := range x {
			out[i] = int64(n)
		}
	case []any:
		out = make([]int64, len(x))
		for i, e := range x {
			n, ok := toInt64(e)
			if !ok {
				return nil, true, fmt.Errorf("tokenizer: %s[%d] is %T, want an integer", key, i, e)
			}
			out[i] = n
		}
	default:
		return nil, true, fmt.Errorf("tokenizer: %s is %T, want an integer array", key, v)
	}
	return out, true, nil
}

// preTokenizerFor maps tokenizer.ggml.pre to llama.cpp's pre-tokenizer settings.
func preTokenizerFor(name string) (preTokenizer, bool) {
	llama3 := []splitPass{splitLlama3}
	qwen2 := []splitPass{splitQwen2}
	gpt2 := []splitPass{splitGPT2}
	digitsThenGPT2 := []splitPass{splitEachNumber, splitGPT2}
	switch name {
	case "", "default":
		return preTokenizer{passes: []splitPass{splitPunctRuns, splitGPT2, splitNumberRuns, splitASCIIDigitTriples}, cleanSpaces: true}, true
	case "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano":
		return preTokenizer{passes: llama3, ignoreMerges: true, addBOS: true, cleanSpaces: true}, true
	case "dbrx", "smaug-bpe":
		return preTokenizer{passes: llama3, cleanSpaces: true}, true
	case "glm4", "chatglm-bpe":
		return preTokenizer{passes: llama3, cleanSpaces: true, nullBOS: true}, true
	case "gpt-2", "gpt2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
		"mellum", "modern-bert", "exaone4", "mpt", "olmo", "jais":
		return preTokenizer{passes: gpt2, cleanSpaces: true}, true
	case "trillion", "granite-docling":
		return preTokenizer{passes: gpt2}, true
	case "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "grok-2", "solar-open":
		return preTokenizer{passes: qwen2}, true
	case "stablelm2", "megrez":
		return preTokenizer{passes: qwen2, cleanSpaces: true}, true
	case "starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2":
		return preTokenizer{passes: digitsThenGPT2, cleanSpaces: true}, true
	case "command-r", "smollm":
		return preTokenizer{passes: digitsThenGPT2}, true
	}
	return preTokenizer{}, false
}

// FromGGUF builds a tokenizer from GGUF metadata (the tokenizer.ggml.* keys and
// tokenizer.chat_template), following llama.cpp's vocabulary loader.
func FromGGUF(md Metadata) (*Tokenizer, error) {
	t, err := fromGGUF(md)
	if err != nil {
		return nil, err
	}
	t.compactTexts()
	return t, nil
}

// fromGGUF is FromGGUF without the final compactTexts.
func fromGGUF(md Metadata) (*Tokenizer, error) {
	model, ok := metaString(md, "tokenizer.ggml.model")
	if !ok {
		return nil, fmt.Errorf("tokenizer: missing tokenizer.ggml.model")
	}
	preName, _ := metaString(md, "tokenizer.ggml.pre")
	t := &Tokenizer{
		preName: preName,
		eot:     nullToken, eom: nullToken, sep: nullToken, pad: nullToken,
		fimPad: nullToken, fimRep: nullToken, fimSep: nullToken,
	}
	switch model {
	case "llama":
		t.kind = kindSPM
		t.bos, t.eos, t.unk = 1, 2, 0
		t.addSpacePrefix = true
		t.addBOS = true
	case "gpt2":
		t.kind = kindBPE
		t.bos, t.eos, t.unk = 11, 11, nullToken
		pre, ok := preTokenizerFor(preName)
		if !ok {
			return nil, fmt.Errorf("tokenizer: unknown pre-tokenizer type %q", preName)
		}
		t.pre = pre
		t.ignoreMerges = pre.ignoreMerges
		t.addBOS = pre.addBOS
		t.cleanSpaces = pre.cleanSpaces
		if pre.nullBOS {
			t.bos = nullToken
		}
	default:
		return nil, fmt.Errorf("tokenizer: unknown tokenizer model %q", model)
	}
	if v, ok := metaBool(md, "tokenizer.ggml.add_space_prefix"); ok {
		t.addSpacePrefix = v
	}

	tokens, ok, err := metaStrings(md, "tokenizer.ggml.tokens")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, fmt.Errorf("tokenizer: missing tokenizer.ggml.tokens")
	}
	n := len(tokens)
	if n == 0 {
		return nil, fmt.Errorf("tokenizer: empty vocabulary")
	}
	if n > 1<<30 {
		return nil, fmt.Errorf("tokenizer: vocabulary too large (%d)", n)
	}
	scores, hasScores, err := metaFloats(md, "tokenizer.ggml.scores")
	if err != nil {
		return nil, err
	}
	if hasScores && len(scores) < n {
		return nil, fmt.Errorf("tokenizer: %d scores for %d tokens", len(scores), n)
	}
	types, hasTypes, err := metaInts(md, "tokenizer.ggml.token_type")
	if err != nil {
		return nil, err
	}
	if hasTypes && len(types) < n {
		return nil, fmt.Errorf("tokenizer: %d token types for %d tokens", len(types), n)
	}

	// The texts are copied out of the metadata (which the model loader
	// drops) into one string; empty texts get names.
	t.tokens = newStringTable(tokens, func(i int) string { return fmt.Sprintf("[EMPTY_%d]", i) })
	if t.kind == kindSPM {
		t.scores = make([]float32, n)
		if hasScores {
			copy(t.scores, scores)
		}
	}
	t.attrs = make([]uint8, n)
	t.tokenToID = newVocabIndex(t, n)
	for i := range n {
		if prev, dup := t.tokenToID.add(int32(i)); dup {
			return nil, fmt.Errorf("tokenizer: duplicate token in vocabulary: %q has ids %d and %d", t.tokens.at(int32(i)), prev, i)
		}
		attr := attrNormal
		if hasTypes {
			switch types[i] {
			case TokenTypeUnknown:
				attr = attrUnknown
			case TokenTypeUnused:
				attr = attrUnused
			case TokenTypeNormal:
				attr = attrNormal
			case TokenTypeControl:
				attr = attrControl
			case TokenTypeUserDefined:
				attr = attrUserDefined
			case TokenTypeByte:
				attr = attrByte
			default:
				attr = 0
			}
		}
		t.attrs[i] = attr
	}

	if t.kind == kindBPE {
		merges, ok, err := metaStrings(md, "tokenizer.ggml.merges")
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("tokenizer: cannot find tokenizer.ggml.merges")
		}
		// A line splits at its first space after the first byte (a
		// symbol may be a space itself).
		t.merges = newMergeTable(merges, func(m string) int {
			if len(m) > 1 {
				if p := strings.IndexByte(m[1:], ' '); p >= 0 {
					return p + 1
				}
			}
			return -1
		}, t.tokenToID)
	}

	// Special token ids: defaults out of range are disabled, bad metadata ids keep the default.
	specialKeys := []struct {
		key string
		id  *int32
	}{
		{"tokenizer.ggml.bos_token_id", &t.bos},
		{"tokenizer.ggml.eos_token_id", &t.eos},
		{"tokenizer.ggml.eot_token_id", &t.eot},
		{"tokenizer.ggml.eom_token_id", &t.eom},
		{"tokenizer.ggml.unknown_token_id", &t.unk},
		{"tokenizer.ggml.seperator_token_id", &t.sep},
		{"tokenizer.ggml.padding_token_id", &t.pad},
		{"tokenizer.ggml.fim_pad_token_id", &t.fimPad},
		{"tokenizer.ggml.fim_rep_token_id", &t.fimRep},
		{"tokenizer.ggml.fim_sep_token_id", &t.fimSep},
	}
	for _, sk := range specialKeys {
		if *sk.id >= int32(n) {
			*sk.id = nullToken
		}
		v, ok := metaInt(md, sk.key)
		if !ok {
			continue
		}
		if v >= 0 && v < int64(n) {
			*sk.id = int32(v)
		}
	}
	if v, ok := metaBool(md, "tokenizer.ggml.add_bos_token"); ok {
		t.addBOS = v
	}
	if v, ok := metaBool(md, "tokenizer.ggml.add_eos_token"); ok {
		t.addEOS = v
	}

	t.finishSpecials()

	if s, ok := metaString(md, "tokenizer.chat_template"); ok {
		t.chatTemplate = s
	}
	t.buildByteTable()
	t.buildPieces()
	return t, nil
}

var eotTexts = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
	"<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"}

var eogTexts = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
	"<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
	"<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["}

var fimTexts = map[string]int{ // text -> fim slot (0 pre, 1 suf, 2 mid, 3 pad, 4 rep, 5 sep)
	"<|fim_prefix|>": 0, "<fim-prefix>": 0, "<fim_prefix>": 0, "<｜fim▁begin｜>": 0, "<PRE>": 0, "▁<PRE>": 0, "<|code_prefix|>": 0, "<|prefix|>": 0,
	"<|fim_suffix|>": 1, "<fim-suffix>": 1, "<fim_suffix>": 1, "<｜fim▁hole｜>": 1, "<SUF>": 1, "▁<SUF>": 1, "<|code_suffix|>": 1, "<|suffix|>": 1,
	"<|fim_middle|>": 2, "<fim-middle>": 2, "<fim_middle>": 2, "<｜fim▁end｜>": 2, "<MID>": 2, "▁<MID>": 2, "<|code_middle|>": 2, "<|middle|>": 2,
	"<|fim_pad|>": 3, "<fim-pad>": 3, "<fim_pad>": 3, "<PAD>": 3, "[PAD]": 3,
	"<|fim_repo|>": 4, "<|repo_name|>": 4, "<fim-repo>": 4, "<REPO>": 4, "<reponame>": 4,
	"<|file_sep|>": 5,
}

// finishSpecials applies llama.cpp's text-based special token detection: it fills
// eot/eom/fim ids, re-types control-looking tokens as control, builds the
// end-of-generation set and the special-token partition order.
func (t *Tokenizer) finishSpecials() {
	n := int32(t.VocabSize())
	fim := [6]int32{nullToken, nullToken, nullToken, t.fimPad, t.fimRep, t.fimSep}
	fimSet := [6]bool{false, false, false, t.fimPad != nullToken, t.fimRep != nullToken, t.fimSep != nullToken}
	makeControl := func(id int32) { t.attrs[id] |= attrControl }
	if t.eot == nullToken {
		for _, s := range eotTexts {
			if id, ok := t.tokenToID.id(s); ok {
				t.eot = id
				makeControl(id)
				break
			}
		}
	}
	if t.eom == nullToken {
		if id, ok := t.tokenToID.id("<|eom_id|>"); ok {
			t.eom = id
			makeControl(id)
		}
	}
	for id := int32(0); id < n; id++ {
		if slot, ok := fimTexts[t.text(id)]; ok && !fimSet[slot] && fim[slot] == nullToken {
			fim[slot] = id
			makeControl(id)
		}
	}
	t.fimPad, t.fimRep, t.fimSep = fim[3], fim[4], fim[5]

	t.eog = map[int32]bool{}
	for _, id := range []int32{t.fimPad, t.fimRep, t.fimSep} {
		if id != nullToken {
			t.eog[id] = true
		}
	}
	for _, s := range eogTexts {
		if id, ok := t.tokenToID.id(s); ok {
			t.eog[id] = true
			makeControl(id)
		}
	}
	for _, s := range []string{"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"} {
		if id, ok := t.tokenToID.id(s); ok {
			t.attrs[id] = attrUserDefined
		}
	}
	for _, id := range []int32{t.eos, t.eot, t.eom} {
		if id != nullToken {
			t.eog[id] = true
		}
	}
	for _, id := range t.extraEOGFromHF {
		if id >= 0 && id < n {
			t.eog[id] = true
		}
	}
	// o200k_harmony / solar-open: <|end|> is not end-of-generation there.
	has := func(s string) (int32, bool) {
		id, ok := t.tokenToID.id(s)
		return id, ok && t.eog[id]
	}
	_, hasReturn := has("<|return|>")
	_, hasCall := has("<|call|>")
	_, hasCalls := has("<|calls|>")
	_, hasFlush := has("<|flush|>")
	if endID, hasEnd := has("<|end|>"); hasEnd && ((hasReturn && (hasCall || hasCalls)) || ((hasCall || hasCalls) && hasFlush)) {
		delete(t.eog, endID)
		t.attrs[endID] = attrUserDefined
	}
	if _, hasTR := has("<|tool_response>"); hasTR {
		if sID, hasS := has("</s>"); hasS {
			delete(t.eog, sID)
			t.attrs[sID] = attrNormal
		}
	}

	t.specials = t.specials[:0]
	for id := int32(0); id < n; id++ {
		if t.attrs[id]&(attrControl|attrUserDefined|attrUnknown) != 0 {
			t.specials = append(t.specials, id)
		}
	}
	sort.SliceStable(t.specials, func(i, j int) bool {
		return len(t.text(t.specials[i])) > len(t.text(t.specials[j]))
	})
}

func (t *Tokenizer) buildByteTable() {
	for b := 0; b < 256; b++ {
		t.byteTok[b] = nullToken
		if t.kind == kindBPE {
			if id, ok := t.tokenToID.id(byteToUnicode[b]); ok {
				t.byteTok[b] = id
			}
		} else {
			if id, ok := t.tokenToID.id(fmt.Sprintf("<0x%02X>", b)); ok {
				t.byteTok[b] = id
			} else if id, ok := t.tokenToID.id(string([]byte{byte(b)})); ok {
				t.byteTok[b] = id
			}
		}
	}
}

func (t *Tokenizer) buildPieces() {
	starts := make([]uint32, t.VocabSize()+1)
	var pieces []byte
	for id := range t.VocabSize() {
		pieces = t.appendPiece(pieces, int32(id))
		starts[id+1] = uint32(len(pieces))
	}
	t.pieces = slices.Clone(pieces) // exactly its size, not append's headroom
	t.pieceOff = newOffsets(starts)
	t.maxTokenBytes = t.longestToken()
}

// longestToken is the most input bytes one token stands for: its piece, or for a
// special token matched in the text, its text. It is 0 when an input byte can map to no
// token (a vocabulary without byte tokens, or an SPM one without them and without
// <unk>), where the count of tokens has no lower bound by length.
func (t *Tokenizer) longestToken() int {
	covered := true
	for _, id := range t.byteTok {
		covered = covered && id != nullToken
	}
	if !covered && !(t.kind == kindSPM && t.unk != nullToken) {
		return 0
	}
	n := 1
	for id := range t.VocabSize() {
		n = max(n, int(t.pieceOff.at(int32(id)+1)-t.pieceOff.at(int32(id))))
	}
	for _, id := range t.specials {
		n = max(n, len(t.tokens.at(id)))
	}
	return n
}

func parseByteToken(s string) (byte, bool) {
	if len(s) != 6 || s[:3] != "<0x" || s[5] != '>' {
		return 0, false
	}
	h := func(c byte) (byte, bool) {
		switch {
		case c >= '0' && c <= '9':
			return c - '0', true
		case c >= 'a' && c <= 'f':
			return c - 'a' + 10, true
		case c >= 'A' && c <= 'F':
			return c - 'A' + 10, true
		}
		return 0, false
	}
	hi, ok1 := h(s[3])
	lo, ok2 := h(s[4])
	return hi<<4 | lo, ok1 && ok2
}

// appendPiece appends the bytes id stands for to dst.
func (t *Tokenizer) appendPiece(dst []byte, id int32) []byte {
	attr := t.attrs[id]
	text := t.tokens.at(id) // not yet compact
	if attr&(attrUnknown|attrControl) != 0 {
		return dst
	}
	if attr&attrUserDefined != 0 {
		return append(dst, text...)
	}
	if attr&attrNormal != 0 {
		if t.kind == kindSPM {
			for {
				i := strings.Index(text, "\u2581")
				if i < 0 {
					break
				}
				dst = append(append(dst, text[:i]...), ' ')
				text = text[i+len("\u2581"):]
			}
			return append(dst, text...)
		}
		return appendByteLevel(dst, text)
	}
	if attr&attrByte != 0 {
		if b, ok := parseByteToken(text); ok {
			return append(dst, b)
		}
	}
	return dst
}

// VocabSize returns the number of tokens in the vocabulary.
func (t *Tokenizer) VocabSize() int { return len(t.attrs) }

// BOS returns the beginning-of-sequence token id, or -1 if there is none.
func (t *Tokenizer) BOS() int32 { return t.bos }

// EOS returns the end-of-sequence token id, or -1 if there is none.
func (t *Tokenizer) EOS() int32 { return t.eos }

// EOT returns the end-of-turn token id, or -1 if there is none.
func (t *Tokenizer) EOT() int32 { return t.eot }

// AddBOS reports whether Encode with addSpecial prepends BOS.
func (t *Tokenizer) AddBOS() bool { return t.addBOS }

// AddEOS reports whether Encode with addSpecial appends EOS.
func (t *Tokenizer) AddEOS() bool { return t.addEOS }

// IsEOG reports whether id ends generation (llama.cpp's special_eog_ids).
func (t *Tokenizer) IsEOG(id int32) bool { return t.eog[id] }

// EOGTokens returns the end-of-generation ids in ascending order.
func (t *Tokenizer) EOGTokens() []int32 {
	out := make([]int32, 0, len(t.eog))
	for id := range t.eog {
		out = append(out, id)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// IsControl reports whether id is a control token (after llama.cpp's re-typing).
func (t *Tokenizer) IsControl(id int32) bool {
	return id >= 0 && int(id) < len(t.attrs) && t.attrs[id]&attrControl != 0
}

// TokenText returns the raw vocabulary text of id ("" when out of range).
// In a byte-level BPE vocabulary most texts are spelled from the token's
// bytes on each call (a small allocation); those of special tokens are not.
func (t *Tokenizer) TokenText(id int32) string {
	if id < 0 || int(id) >= t.VocabSize() {
		return ""
	}
	return t.text(id)
}

// TokenID returns the id whose vocabulary text is exactly s.
func (t *Tokenizer) TokenID(s string) (int32, bool) {
	id, ok := t.tokenToID.id(s)
	return id, ok
}

// ChatTemplate returns the model's Jinja chat template ("" if none).
func (t *Tokenizer) ChatTemplate() string { return t.chatTemplate }

// Piece returns llama_token_to_piece(id, special=false): the bytes id stands for.
// Control and unknown tokens give no bytes. The returned slice must not be modified.
func (t *Tokenizer) Piece(id int32) []byte {
	if id < 0 || int(id) >= t.VocabSize() {
		return nil
	}
	start, end := t.pieceOff.at(id), t.pieceOff.at(id+1)
	if start == end {
		return nil
	}
	return t.pieces[start:end:end]
}

// Decode returns llama_detokenize(ids, remove_special=false, unparse_special=false):
// the concatenated pieces, with the first piece's leading space removed for SPM
// vocabs that add a space prefix, and llama.cpp's clean-up of spaces where the vocab uses it.
func (t *Tokenizer) Decode(ids []int32) string {
	var buf []byte
	for i, id := range ids {
		p := t.Piece(id)
		if i == 0 && t.addSpacePrefix && len(p) > 0 && p[0] == ' ' {
			p = p[1:]
		}
		buf = append(buf, p...)
	}
	if t.cleanSpaces {
		buf = cleanSpaces(buf)
	}
	return string(buf)
}

// cleanSpaces applies llama.cpp's clean_up_tokenization_spaces passes in place.
func cleanSpaces(text []byte) []byte {
	// Pass 1: drop a space before ? ! . ,
	n := len(text)
	total := 0
	if n > 0 {
		total = 1
	}
	for i := 1; i < n; i++ {
		x := text[i]
		if text[i-1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',') {
			total--
		}
		text[total] = x
		total++
	}
	// Pass 2: " ' " becomes "'".
	n = total
	if n > 0 {
		total = 1
	} else {
		total = 0
	}
	for i := 1; i < n; i++ {
		x := text[i]
		if x == '\'' && i+1 < n && text[i-1] == ' ' && text[i+1] == ' ' {
			total--
			i++
			text[i] = 0
		}
		text[total] = x
		total++
	}
	// Pass 3: " 's", " 'm", " 're", " 've" lose the space.
	n = total
	if n > 0 {
		total = 1
	} else {
		total = 0
	}
	for i := 1; i < n; i++ {
		x := text[i]
		if text[i-1] == ' ' && x == '\'' && i+1 < n {
			x1 := text[i+1]
			if x1 == 's' || x1 == 'm' {
				total--
			} else if i+2 < n {
				x2 := text[i+2]
				if (x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e') {
					total--
				}
			}
		}
		text[total] = x
		total++
	}
	return text[:total]
}
