package openai

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

type parsedCall struct {
	Name, Args string
}

// runParser feeds text to a parser in chunks of the given sizes and returns the text and
// the calls it made, and the calls that broke.
func runParser(f *toolFormat, forced bool, text string, sizes func() int) (string, []parsedCall, int) {
	p := newToolParser(f, forced)
	var content strings.Builder
	var calls []parsedCall
	broken := 0
	take := func(evs []toolEvent) {
		for _, ev := range evs {
			switch ev.kind {
			case evText:
				content.WriteString(ev.text)
			case evCallStart:
				calls = append(calls, parsedCall{Name: ev.text})
			case evCallArgs:
				calls[len(calls)-1].Args += ev.text
			case evCallBroken:
				broken++
			}
		}
	}
	for len(text) > 0 {
		n := min(sizes(), len(text))
		take(p.feed(text[:n], false))
		text = text[n:]
	}
	take(p.feed("", true))
	return content.String(), calls, broken
}

func compactJSON(s string) string {
	var v any
	if json.Unmarshal([]byte(s), &v) != nil {
		return "invalid:" + s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func TestToolParser(t *testing.T) {
	cases := []struct {
		format, text string
		forced       bool
		content      string
		calls        []parsedCall
		broken       int
	}{
		{"hermes", "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, {\"x\": \"}\"}]}}\n</tool_call>", false,
			"Let me check.\n", []parsedCall{{"get_weather", `{"city":"Paris","n":[1,{"x":"}"}]}`}}, 0},
		{"hermes", "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"arguments\": {\"k\": 1}, \"name\": \"b\"}\n</tool_call>", false,
			"", []parsedCall{{"a", `{}`}, {"b", `{"k":1}`}}, 0},
		{"hermes", "no calls here, just <tool text", false, "no calls here, just <tool text", nil, 0},
		{"hermes", "<tool_call>\nnot json\n</tool_call>", false, "<tool_call>\nnot json\n</tool_call>", nil, 0},
		{"hermes", "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1", false, "", []parsedCall{{"a", `invalid:{"x": 1`}}, 1},
		{"hermes", "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"q\\\": 2}\"}\n</tool_call> done", false,
			" done", []parsedCall{{"f", `{"q":2}`}}, 0},
		{"hermes", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>", false, "", []parsedCall{{"f", `{}`}}, 0},
		{"llama3_json", "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", false,
			"", []parsedCall{{"get_weather", `{"city":"Oslo"}`}}, 0},
		{"llama3_json", "  <|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"arguments\": {\"y\": true}}", false,
			"", []parsedCall{{"a", `{}`}, {"b", `{"y":true}`}}, 0},
		{"llama3_json", "Hello {\"name\": \"x\"}", false, "Hello {\"name\": \"x\"}", nil, 0},
		{"llama3_json", "{\"answer\": 42}", false, "{\"answer\": 42}", nil, 0},
		{"mistral", "Sure. [TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"z\": \"]\"}}, {\"name\": \"b\", \"arguments\": {}}]", false,
			"Sure. ", []parsedCall{{"a", `{"z":"]"}`}, {"b", `{}`}}, 0},
		{"mistral", "[TOOL_CALLS]get_time[ARGS]{\"tz\": \"UTC\"}", false, "", []parsedCall{{"get_time", `{"tz":"UTC"}`}}, 0},
		{"mistral", "[{\"name\": \"a\", \"arguments\": {\"v\": 1}}]", true, "", []parsedCall{{"a", `{"v":1}`}}, 0},
		{"mistral", "[1, 2]", false, "[1, 2]", nil, 0},
	}
	for i, tc := range cases {
		for _, chunk := range []int{1, 2, 3, 7, 1000, -1} {
			rng := rand.New(rand.NewPCG(uint64(i), uint64(chunk+2)))
			sizes := func() int {
				if chunk < 0 {
					return 1 + rng.IntN(9)
				}
				return chunk
			}
			content, calls, broken := runParser(toolFormats[tc.format], tc.forced, tc.text, sizes)
			for k := range calls {
				calls[k].Args = compactJSON(calls[k].Args)
			}
			if content != tc.content || broken != tc.broken || !reflect.DeepEqual(calls, tc.calls) && !(len(calls) == 0 && len(tc.calls) == 0) {
				t.Errorf("%s %q (chunks %d):\n content %q calls %v broken %d\n want    %q calls %v broken %d",
					tc.format, tc.text, chunk, content, calls, broken, tc.content, tc.calls, tc.broken)
			}
		}
	}
}

func TestReasoningSplitter(t *testing.T) {
	cases := []struct {
		inside             bool
		text               string
		reasoning, content string
	}{
		{false, "<think>\nLet me see.\n</think>\n\nThe answer.", "Let me see.", "The answer."},
		{false, "  <think>a</think>b", "a", "b"},
		{false, "No thinking here.", "", "No thinking here."},
		{false, "<thinking is a word", "", "<thinking is a word"},
		{true, "\nstill thinking\n\n</think>\n\nDone </think> twice", "still thinking", "Done </think> twice"},
		{true, "cut off mid-thought  ", "cut off mid-thought", ""},
		{false, "<think></think>{}", "", "{}"},
	}
	for i, tc := range cases {
		for _, chunk := range []int{1, 2, 5, 1000, -1} {
			rng := rand.New(rand.NewPCG(uint64(i), 9))
			r := newReasoningSplitter(tc.inside)
			var rs, cs strings.Builder
			text := tc.text
			for len(text) > 0 {
				n := chunk
				if n < 0 {
					n = 1 + rng.IntN(6)
				}
				n = min(n, len(text))
				a, b := r.feed(text[:n], false)
				rs.WriteString(a)
				cs.WriteString(b)
				text = text[n:]
			}
			a, b := r.feed("", true)
			rs.WriteString(a)
			cs.WriteString(b)
			if rs.String() != tc.reasoning || cs.String() != tc.content {
				t.Errorf("%q (chunks %d): reasoning %q content %q, want %q %q", tc.text, chunk, rs.String(), cs.String(), tc.reasoning, tc.content)
			}
		}
	}
}

func TestToolFormatFromTemplate(t *testing.T) {
	for tmpl, want := range map[string]string{
		"... <tool_call> ...":                      "hermes",
		"[INST] [TOOL_CALLS] [/INST]":              "mistral",
		"<|start_header_id|>user<|end_header_id|>": "llama3_json",
		"{{ messages }}":                           "",
	} {
		got := ""
		if f := toolFormatFor("auto", tmpl); f != nil {
			got = f.name
		}
		if got != want {
			t.Errorf("%q: %q, want %q", tmpl, got, want)
		}
	}
	if f := toolFormatFor("mistral", "<tool_call>"); f == nil || f.name != "mistral" {
		t.Error("an explicit parser does not win over the template")
	}
	if toolFormatFor("none", "<tool_call>") != nil {
		t.Error("none does not turn tool calling off")
	}
}
