package openai

import (
	"encoding/json"
	"reflect"
	"slices"
	"testing"
)

func TestScanTokenIDs(t *testing.T) {
	for _, c := range []struct {
		in   string
		want []int32 // nil: left to encoding/json
		end  int
	}{
		{in: `[1,2,3]`, want: []int32{1, 2, 3}, end: 7},
		{in: " \n[ 0 ,\t7\r,2147483647 ] tail", want: []int32{0, 7, 2147483647}, end: 23},
		{in: `[42]`, want: []int32{42}, end: 4},
		{in: `[]`},
		{in: `[ ]`},
		{in: `[2147483648]`}, // past int32: encoding/json's error message
		{in: `[-1]`},
		{in: `[01]`},
		{in: `[1.0]`},
		{in: `[1e3]`},
		{in: `[1,null]`},
		{in: `[1,"2"]`},
		{in: `[1,]`},
		{in: `[1 2]`},
		{in: `[1`},
		{in: `[[1]]`},
		{in: `"1"`},
		{in: ``},
	} {
		ids, end, ok := scanTokenIDs([]byte(c.in))
		if ok != (c.want != nil) || !slices.Equal(ids, c.want) || ok && end != c.end {
			t.Errorf("scanTokenIDs(%q) = %v, %d, %v; want %v, %d", c.in, ids, end, ok, c.want, c.end)
		}
	}
}

func TestCutPromptIDs(t *testing.T) {
	for _, c := range []struct {
		in   string
		ids  []int32 // nil: the body is decoded as it is
		rest string
	}{
		{in: `{"model":"m","prompt":[1,2,3],"max_tokens":4}`, ids: []int32{1, 2, 3}, rest: `{"model":"m","prompt":[],"max_tokens":4}`},
		{in: ` { "prompt" : [5] , "stop":["]\"}"], "user":{"a":[{}]}} `, ids: []int32{5}, rest: ` { "prompt" : [] , "stop":["]\"}"], "user":{"a":[{}]}} `},
		{in: `{"prompt":"text"}`},
		{in: `{"prompt":[[1,2]]}`},
		{in: `{"prompt":[1],"Prompt":[2]}`},      // encoding/json matches keys in any case
		{in: `{"PROMPT":[1]}`},                   // ditto
		{in: `{"prompt":[1],"prompt":[2]}`},      // the last one wins in encoding/json
		{in: `{"pr\u006fmpt":[1],"prompt":[2]}`}, // an escaped key
		{in: `{"model":"m"}`},
		{in: `[1,2]`},
		{in: `{"prompt":[1]} x`},
		{in: `{"prompt":[1]`},
		{in: `{"a":"unterminated,"prompt":[1]}`},
	} {
		ids, rest, ok := cutPromptIDs([]byte(c.in))
		if ok != (c.ids != nil) || !slices.Equal(ids, c.ids) || ok && string(rest) != c.rest {
			t.Errorf("cutPromptIDs(%q) = %v, %q, %v; want %v, %q", c.in, ids, rest, ok, c.ids, c.rest)
		}
	}
}

// FuzzScanTokenIDs: what scanTokenIDs reads, encoding/json reads the same.
func FuzzScanTokenIDs(f *testing.F) {
	for _, s := range []string{`[1,2,3]`, ` [ 0 , 7 ] x`, `[2147483647]`, `[2147483648]`, `[01]`, `[1e3]`, `[-1]`, `[]`, `[1,]`, `[1,null]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ids, end, ok := scanTokenIDs(b)
		if !ok {
			return
		}
		var want []int64
		if err := json.Unmarshal(b[:end], &want); err != nil {
			t.Fatalf("scanTokenIDs(%q) read %v; encoding/json: %v", b, ids, err)
		}
		if len(want) != len(ids) {
			t.Fatalf("scanTokenIDs(%q) = %v; encoding/json %v", b, ids, want)
		}
		for i := range want {
			if int64(ids[i]) != want[i] {
				t.Fatalf("scanTokenIDs(%q) = %v; encoding/json %v", b, ids, want)
			}
		}
	})
}

// FuzzCutPromptIDs: a body cut by cutPromptIDs decodes, as parseCompletion decodes it
// (the copy, or the body itself when the copy fails), to the request encoding/json makes
// of the whole body, with the same prompt.
func FuzzCutPromptIDs(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":[1,2,3],"max_tokens":4}`,
		`{"prompt":[5],"stop":["]\"}"],"user":"u","logit_bias":{"1":2}}`,
		`{"prompt":[1],"max_tokens":"x"}`,
		`{"prompt":[1],"Prompt":"x"}`,
		`{"prompt":[1],"stream":tru}`,
		`{"prompt":[1],}`,
		`{"prompt":[1] "model":"m"}`,
		`{"model":"m",,"prompt":[1]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ids, rest, ok := cutPromptIDs(b)
		if !ok {
			return
		}
		var whole completionRequest
		werr := json.Unmarshal(b, &whole)
		var cut completionRequest
		if err := json.Unmarshal(rest, &cut); err != nil {
			return // parseCompletion decodes the body itself then
		}
		if werr != nil {
			t.Fatalf("body %q: its cut copy %q decodes, the body does not: %v", b, rest, werr)
		}
		var prompt []int64
		if err := json.Unmarshal(whole.Prompt, &prompt); err != nil {
			t.Fatalf("body %q: cut ids %v, encoding/json's prompt %s: %v", b, ids, whole.Prompt, err)
		}
		if len(prompt) != len(ids) {
			t.Fatalf("body %q: cut ids %v, encoding/json's %v", b, ids, prompt)
		}
		for i := range prompt {
			if int64(ids[i]) != prompt[i] {
				t.Fatalf("body %q: cut ids %v, encoding/json's %v", b, ids, prompt)
			}
		}
		whole.Prompt, cut.Prompt = nil, nil
		if !reflect.DeepEqual(whole, cut) {
			t.Fatalf("body %q: the cut copy decodes to\n%+v\nthe body to\n%+v", b, cut, whole)
		}
	})
}
