package openai_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"tandem/openai"
)

// TestTokenIDPromptPaths: a completion whose prompt is plain token ids (read by hand)
// answers exactly as the same request written so that encoding/json reads it (a first
// "prompt" field that a second one overrides), errors included.
func TestTokenIDPromptPaths(t *testing.T) {
	e := newEnv(t, openai.Options{})
	url := e.srv.URL + "/v1/completions"
	for _, c := range []struct {
		name, prompt, rest string
		status             int
	}{
		{"greedy", `[1, 403,11,  72 ,9]`, `"max_tokens":4,"temperature":0`, 200},
		{"echo", `[1,403,11,72,9]`, `"max_tokens":3,"temperature":0,"echo":true`, 200},
		{"session and stop", "[1,\n403,11]", `"max_tokens":3,"temperature":0,"user":"u7","stop":["\"]"]`, 200},
		{"outside the vocabulary", `[1,403,512]`, `"max_tokens":3`, 400},
		{"past int32", `[1,2147483648]`, `"max_tokens":3`, 400},
		{"a field of the wrong type", `[1,403]`, `"max_tokens":"3"`, 400},
		{"too long for the context", "[" + strings.Repeat("5,", 600) + "5]", `"max_tokens":3`, 400},
	} {
		t.Run(c.name, func(t *testing.T) {
			fast := do(t, "POST", url, `{"model":"stories","prompt":`+c.prompt+`,`+c.rest+`}`)
			slow := do(t, "POST", url, `{"model":"stories","prompt":"decoded by encoding/json","prompt":`+c.prompt+`,`+c.rest+`}`)
			if fast.status != c.status || slow.status != c.status {
				t.Fatalf("status %d (hand-read) and %d (encoding/json), want %d: %s / %s", fast.status, slow.status, c.status, fast.body, slow.body)
			}
			var a, b map[string]any
			if err := json.Unmarshal(fast.body, &a); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(slow.body, &b); err != nil {
				t.Fatal(err)
			}
			for _, m := range []map[string]any{a, b} {
				delete(m, "id")
				delete(m, "created")
			}
			if !reflect.DeepEqual(a, b) {
				t.Errorf("hand-read prompt answers\n%s\nencoding/json's\n%s", fast.body, slow.body)
			}
		})
	}
}
