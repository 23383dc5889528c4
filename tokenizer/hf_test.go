package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"
)

// hfFilesFromTokenizer writes tokenizer.json/tokenizer_config.json equivalent to a
// GGUF-loaded byte-level BPE tokenizer, the way Llama 3 and Qwen2 ship them.
func hfFilesFromTokenizer(t *testing.T, tk *Tokenizer, pattern string, bosText, eosText string, addBOS bool, genEOS []int32) string {
	t.Helper()
	vocab := map[string]int{}
	var added []map[string]any
	for id := range tk.VocabSize() {
		s := tk.TokenText(int32(id))
		switch {
		case tk.attrs[id]&attrUnused != 0 && tk.attrs[id]&attrControl == 0:
			// left as a gap: FromHF recreates it as [PADn]
		case tk.attrs[id]&attrControl != 0 && tk.attrs[id]&attrNormal == 0:
			added = append(added, map[string]any{"id": id, "content": s, "special": true})
		case tk.attrs[id]&attrUserDefined != 0:
			added = append(added, map[string]any{"id": id, "content": s, "special": false})
		default:
			vocab[s] = id
		}
	}
	var merges []string
	for _, p := range mergePairs(tk) {
		merges = append(merges, p[0]+" "+p[1])
	}
	var post map[string]any
	if addBOS {
		post = map[string]any{"type": "TemplateProcessing",
			"single": []any{map[string]any{"SpecialToken": map[string]any{"id": bosText, "type_id": 0}},
				map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}}}
	} else {
		post = map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}
	}
	tj := map[string]any{
		"version":      "1.0",
		"added_tokens": added,
		"normalizer":   nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": pattern}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
		}},
		"post_processor": post,
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model": map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "byte_fallback": false,
			"ignore_merges": true, "vocab": vocab, "merges": merges},
	}
	cfg := map[string]any{"bos_token": bosText, "eos_token": eosText, "chat_template": tk.ChatTemplate()}
	dir := t.TempDir()
	writeJSON(t, filepath.Join(dir, "tokenizer.json"), tj)
	writeJSON(t, filepath.Join(dir, "tokenizer_config.json"), cfg)
	writeJSON(t, filepath.Join(dir, "config.json"), map[string]any{"vocab_size": tk.VocabSize()})
	if genEOS != nil {
		writeJSON(t, filepath.Join(dir, "generation_config.json"), map[string]any{"eos_token_id": genEOS})
	}
	return dir
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestFromHFByteLevel(t *testing.T) {
	cases := []struct {
		vocab, pattern string
		bos, eos       string
		addBOS         bool
		genEOS         []int32
	}{
		{"llama-bpe", hfPatternLlama3, "<|begin_of_text|>", "<|end_of_text|>", true, []int32{128001, 128009}},
		{"qwen2", hfPatternQwen2, "<|endoftext|>", "<|im_end|>", false, []int32{151645, 151643}},
	}
	for _, c := range cases {
		t.Run(c.vocab, func(t *testing.T) {
			gg, v := loadVocab(t, c.vocab)
			dir := hfFilesFromTokenizer(t, gg, c.pattern, c.bos, c.eos, c.addBOS, c.genEOS)
			hf, err := FromHF(dir)
			if err != nil {
				t.Fatal(err)
			}
			if hf.VocabSize() != gg.VocabSize() || hf.BOS() != gg.BOS() || hf.EOS() != gg.EOS() || hf.AddBOS() != gg.AddBOS() {
				t.Errorf("HF vocab/bos/eos/add_bos = %d/%d/%d/%v, GGUF %d/%d/%d/%v", hf.VocabSize(), hf.BOS(), hf.EOS(), hf.AddBOS(),
					gg.VocabSize(), gg.BOS(), gg.EOS(), gg.AddBOS())
			}
			for _, id := range c.genEOS {
				if !hf.IsEOG(id) {
					t.Errorf("generation_config eos %d is not EOG", id)
				}
			}
			if hf.ChatTemplate() != gg.ChatTemplate() {
				t.Errorf("chat template differs")
			}
			var pass, tjsAgree, tjsTotal int
			for _, r := range v.Results {
				ok := true
				if got := hf.Encode(r.Text, false, false); !slices.Equal(got, r.IDs) && len(got)+len(r.IDs) > 0 {
					t.Errorf("%q ids: got %v want %v", r.Text, got, r.IDs)
					ok = false
				}
				gotPS := hf.Encode(r.Text, false, true)
				if !slices.Equal(gotPS, r.IDsParseSpecial) && len(gotPS)+len(r.IDsParseSpecial) > 0 {
					t.Errorf("%q ids_parse_special: got %v want %v", r.Text, gotPS, r.IDsParseSpecial)
					ok = false
				}
				if d := hf.Decode(r.IDs); d != r.Detokenized {
					t.Errorf("%q detokenized: got %q want %q", r.Text, d, r.Detokenized)
					ok = false
				}
				if ok {
					pass++
				}
				if r.TransformersJSIDs != nil {
					tjsTotal++
					if slices.Equal(gotPS, r.TransformersJSIDs) || len(gotPS)+len(r.TransformersJSIDs) == 0 {
						tjsAgree++
					} else {
						t.Logf("differs from transformers.js on %q: %v vs %v (llama.cpp behaviour kept; ids without parse_special: %v)", r.Text, gotPS, r.TransformersJSIDs, r.IDs)
					}
				}
			}
			t.Logf("%s via FromHF: %d/%d golden strings match llama.cpp; %d/%d match transformers.js", c.vocab, pass, len(v.Results), tjsAgree, tjsTotal)
			msgs := []Message{{Role: "user", Content: "hi"}}
			a, err1 := hf.ApplyChatTemplate(msgs, true)
			b, err2 := gg.ApplyChatTemplate(msgs, true)
			if err1 != nil || err2 != nil || a != b {
				t.Errorf("chat template render differs: %q/%v vs %q/%v", a, err1, b, err2)
			}
		})
	}
}

// spmHFDir writes a SentencePiece-style BPE tokenizer.json (Llama 2 / Mistral layout)
// for a GGUF SPM vocab, deriving merges from the scores as HF's converter does.
func spmHFDir(t *testing.T, tk *Tokenizer) string {
	t.Helper()
	vocab := map[string]int{}
	var added []map[string]any
	for id, s := range vocabTexts(tk) {
		if tk.attrs[id]&(attrControl|attrUnknown) != 0 {
			added = append(added, map[string]any{"id": id, "content": s, "special": true})
		}
		vocab[s] = id
	}
	type merge struct {
		a, b   string
		score  float32
		ia, ib int
	}
	var ms []merge
	for id, s := range vocabTexts(tk) {
		if tk.attrs[id]&attrNormal == 0 {
			continue
		}
		for i := 1; i < len(s); i++ {
			if !utf8.RuneStart(s[i]) {
				continue
			}
			ia, oka := vocab[s[:i]]
			ib, okb := vocab[s[i:]]
			if oka && okb && tk.attrs[ia]&attrNormal != 0 && tk.attrs[ib]&attrNormal != 0 {
				ms = append(ms, merge{s[:i], s[i:], tk.scores[id], ia, ib})
			}
		}
	}
	sort.SliceStable(ms, func(i, j int) bool {
		if ms[i].score != ms[j].score {
			return ms[i].score > ms[j].score
		}
		if ms[i].ia != ms[j].ia {
			return ms[i].ia < ms[j].ia
		}
		return ms[i].ib < ms[j].ib
	})
	merges := make([][]string, len(ms))
	for i, m := range ms {
		merges[i] = []string{m.a, m.b}
	}
	tj := map[string]any{
		"added_tokens": added,
		"normalizer": map[string]any{"type": "Sequence", "normalizers": []any{
			map[string]any{"type": "Prepend", "prepend": "▁"},
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"},
		}},
		"pre_tokenizer": nil,
		"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "ByteFallback"}, map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0},
		}},
		"model": map[string]any{"type": "BPE", "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true,
			"vocab": vocab, "merges": merges},
	}
	dir := t.TempDir()
	writeJSON(t, filepath.Join(dir, "tokenizer.json"), tj)
	writeJSON(t, filepath.Join(dir, "tokenizer_config.json"), map[string]any{
		"bos_token": map[string]any{"content": "<s>"}, "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": true})
	return dir
}

func TestFromHFSentencePieceBPE(t *testing.T) {
	for _, name := range []string{"tok512", "llama-spm"} {
		t.Run(name, func(t *testing.T) {
			gg, v := loadVocab(t, name)
			hf, err := FromHF(spmHFDir(t, gg))
			if err != nil {
				t.Fatal(err)
			}
			if hf.BOS() != 1 || hf.EOS() != 2 || !hf.AddBOS() {
				t.Errorf("bos/eos/add_bos = %d/%d/%v", hf.BOS(), hf.EOS(), hf.AddBOS())
			}
			pass := 0
			for _, r := range v.Results {
				got := hf.Encode(r.Text, false, true)
				if slices.Equal(got, r.IDsParseSpecial) || len(got)+len(r.IDsParseSpecial) == 0 {
					pass++
				} else {
					t.Logf("%q: BPE-by-rank %v, llama.cpp SPM %v", r.Text, got, r.IDsParseSpecial)
				}
				if d := hf.Decode(got); d != hf.Decode(r.IDsParseSpecial) {
					t.Errorf("%q: decode differs: %q vs %q", r.Text, d, hf.Decode(r.IDsParseSpecial))
				}
			}
			t.Logf("%s via FromHF (SentencePiece-style BPE): %d/%d golden strings give llama.cpp's ids", name, pass, len(v.Results))
			if pass < len(v.Results)*9/10 {
				t.Errorf("only %d/%d match", pass, len(v.Results))
			}
		})
	}
}

func TestFromHFErrors(t *testing.T) {
	for _, c := range []struct{ name, json, want string }{
		{"not json", "{", ""},
		{"unigram", `{"model":{"type":"Unigram","vocab":[]}}`, ""},
		{"empty", `{"model":{"type":"BPE","vocab":{},"merges":[]}}`, "model.vocab"},
		// Loaded before, with every character of every text mapped to <unk>.
		{"no vocab", `{"added_tokens":[{"id":0,"content":"<unk>","special":true}],"model":{"type":"BPE","unk_token":"<unk>","merges":[]}}`, "model.vocab"},
		{"bad split", `{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"x+"}},"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`, ""},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(c.json), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := FromHF(dir); err == nil {
			t.Errorf("%s: expected an error", c.name)
		} else if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want it to name %q", c.name, err, c.want)
		}
	}
	if _, err := FromHF(t.TempDir()); err == nil {
		t.Error("missing tokenizer.json: expected an error")
	}
}
