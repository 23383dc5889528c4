package tokenizer

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"tandem/internal/fixtures"
	"testing"

	"tandem/gguf"
)

func fixturesDir(t testing.TB) string { return fixtures.Dir(t) }

type goldenResult struct {
	Text              string  `json:"text"`
	IDs               []int32 `json:"ids"`
	IDsParseSpecial   []int32 `json:"ids_parse_special"`
	Detokenized       string  `json:"detokenized"`
	DetokenizedHex    string  `json:"detokenized_hex"`
	TransformersJSIDs []int32 `json:"transformers_js_ids"`
}

type goldenVocab struct {
	File    string         `json:"file"`
	NVocab  int            `json:"n_vocab"`
	AddBOS  bool           `json:"add_bos"`
	BOSID   int32          `json:"bos_id"`
	EOSID   int32          `json:"eos_id"`
	Results []goldenResult `json:"results"`
}

type goldenFile struct {
	Vocabs map[string]goldenVocab `json:"vocabs"`
}

var vocabOrder = []string{"llama-bpe", "qwen2", "llama-spm", "gpt-2", "tok512"}

var (
	goldenOnce sync.Once
	goldenData goldenFile
	goldenErr  error
	tokMu      sync.Mutex
	tokCache   = map[string]*Tokenizer{}
)

func loadGolden(t testing.TB) goldenFile {
	dir := fixturesDir(t)
	goldenOnce.Do(func() {
		b, err := os.ReadFile(filepath.Join(dir, "golden", "tokenizer.golden.json"))
		if err != nil {
			goldenErr = err
			return
		}
		goldenErr = json.Unmarshal(b, &goldenData)
	})
	if goldenErr != nil {
		t.Fatal(goldenErr)
	}
	return goldenData
}

// loadModelTokenizer opens a fixture GGUF (by file name) and builds its tokenizer.
func loadModelTokenizer(t testing.TB, file string) *Tokenizer {
	t.Helper()
	dir := fixturesDir(t)
	tokMu.Lock()
	defer tokMu.Unlock()
	if tk, ok := tokCache[file]; ok {
		return tk
	}
	f, err := gguf.Open(filepath.Join(dir, "models", file))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tk, err := FromGGUF(f)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	tokCache[file] = tk
	return tk
}

func loadVocab(t testing.TB, name string) (*Tokenizer, goldenVocab) {
	g := loadGolden(t)
	v, ok := g.Vocabs[name]
	if !ok {
		t.Fatalf("vocab %s not in golden file", name)
	}
	return loadModelTokenizer(t, v.File), v
}

func TestGolden(t *testing.T) {
	for _, name := range vocabOrder {
		t.Run(name, func(t *testing.T) {
			tk, v := loadVocab(t, name)
			if tk.VocabSize() != v.NVocab {
				t.Errorf("VocabSize = %d, want %d", tk.VocabSize(), v.NVocab)
			}
			if tk.AddBOS() != v.AddBOS || tk.BOS() != v.BOSID || tk.EOS() != v.EOSID {
				t.Errorf("AddBOS/BOS/EOS = %v/%d/%d, want %v/%d/%d", tk.AddBOS(), tk.BOS(), tk.EOS(), v.AddBOS, v.BOSID, v.EOSID)
			}
			pass := [3]int{}
			for i, r := range v.Results {
				got := tk.Encode(r.Text, false, false)
				if slices.Equal(got, r.IDs) || (len(got) == 0 && len(r.IDs) == 0) {
					pass[0]++
				} else {
					t.Errorf("#%d %q ids:\n got  %v\n want %v", i, r.Text, got, r.IDs)
				}
				gotPS := tk.Encode(r.Text, false, true)
				if slices.Equal(gotPS, r.IDsParseSpecial) || (len(gotPS) == 0 && len(r.IDsParseSpecial) == 0) {
					pass[1]++
				} else {
					t.Errorf("#%d %q ids_parse_special:\n got  %v\n want %v", i, r.Text, gotPS, r.IDsParseSpecial)
				}
				if d := tk.Decode(r.IDs); d == r.Detokenized {
					pass[2]++
				} else {
					t.Errorf("#%d %q detokenized: got %q want %q", i, r.Text, d, r.Detokenized)
				}
			}
			t.Logf("%s: ids %d/%d, ids_parse_special %d/%d, detokenized %d/%d", name,
				pass[0], len(v.Results), pass[1], len(v.Results), pass[2], len(v.Results))
		})
	}
}

// TestGoldenAddSpecial checks BOS handling on top of the golden ids.
func TestGoldenAddSpecial(t *testing.T) {
	for _, name := range vocabOrder {
		t.Run(name, func(t *testing.T) {
			tk, v := loadVocab(t, name)
			for _, r := range v.Results {
				want := r.IDs
				if v.AddBOS {
					want = append([]int32{v.BOSID}, want...)
				}
				if got := tk.Encode(r.Text, true, false); !slices.Equal(got, want) {
					t.Errorf("%q add_special: got %v want %v", r.Text, got, want)
				}
			}
		})
	}
}

type modelGolden struct {
	Model   string `json:"model"`
	AddBOS  bool   `json:"add_bos"`
	BOSID   int32  `json:"bos_id"`
	EOSID   int32  `json:"eos_id"`
	Results []struct {
		Name             string  `json:"name"`
		Text             string  `json:"text"`
		TokensAddSpecial []int32 `json:"tokens_add_special"`
		TokensNoSpecial  []int32 `json:"tokens_no_special"`
		Greedy           struct {
			IDs     []int32 `json:"ids"`
			Text    string  `json:"text"`
			TextHex string  `json:"text_hex"`
			Steps   []struct {
				ID       int32  `json:"id"`
				PieceHex string `json:"piece_hex"`
			} `json:"steps"`
		} `json:"greedy"`
	} `json:"results"`
}

// TestModelGoldens checks prompt tokenization, per-token pieces and the detokenized
// greedy text recorded in every <model>.golden.json.
func TestModelGoldens(t *testing.T) {
	dir := fixturesDir(t)
	files, _ := filepath.Glob(filepath.Join(dir, "golden", "*.golden.json"))
	for _, path := range files {
		base := filepath.Base(path)
		if base == "tokenizer.golden.json" {
			continue
		}
		model := base[:len(base)-len(".golden.json")] + ".gguf"
		t.Run(model, func(t *testing.T) {
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var g modelGolden
			if err := json.Unmarshal(b, &g); err != nil {
				t.Fatal(err)
			}
			tk := loadModelTokenizer(t, model)
			for _, r := range g.Results {
				if got := tk.Encode(r.Text, true, false); !slices.Equal(got, r.TokensAddSpecial) {
					t.Errorf("%s add_special: got %v want %v", r.Name, got, r.TokensAddSpecial)
				}
				if got := tk.Encode(r.Text, false, false); !slices.Equal(got, r.TokensNoSpecial) {
					t.Errorf("%s no_special: got %v want %v", r.Name, got, r.TokensNoSpecial)
				}
				for _, st := range r.Greedy.Steps {
					if got := hex.EncodeToString(tk.Piece(st.ID)); got != st.PieceHex {
						t.Errorf("%s piece(%d) = %s want %s", r.Name, st.ID, got, st.PieceHex)
					}
				}
				if got := hex.EncodeToString([]byte(tk.Decode(r.Greedy.IDs))); got != r.Greedy.TextHex {
					t.Errorf("%s greedy text: got %q want %q", r.Name, tk.Decode(r.Greedy.IDs), r.Greedy.Text)
				}
				if got, want := streamAll(tk, r.Greedy.IDs), string([]rune(tk.Decode(r.Greedy.IDs))); got != want {
					t.Errorf("%s stream: got %q want %q", r.Name, got, tk.Decode(r.Greedy.IDs))
				}
			}
		})
	}
}

func TestEOG(t *testing.T) {
	cases := map[string][]int32{
		"llama-bpe": {128001, 128009}, // Llama 3 base: no <|eom_id|>
		"qwen2":     {128247, 151643, 151645, 151662, 151663, 151664},
		"llama-spm": {2},
		"gpt-2":     {50256},
		"tok512":    {2},
	}
	for name, want := range cases {
		tk, _ := loadVocab(t, name)
		if got := tk.EOGTokens(); !slices.Equal(got, want) {
			t.Errorf("%s: EOG = %v, want %v", name, got, want)
		}
	}
	tk, _ := loadVocab(t, "qwen2")
	if !tk.IsControl(128247) || tk.TokenText(128247) != "</s>" {
		t.Errorf("qwen2 </s> should be re-typed as control")
	}
}
