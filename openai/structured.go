package openai

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"

	"tandem/grammar"
)

// Structured outputs: the fields that constrain a choice's text to a language, compiled
// by package grammar into the request's llm.Constraint (docs/structured-outputs.md).
type formatFields struct {
	ResponseFormat          json.RawMessage `json:"response_format"`
	GuidedJSON              json.RawMessage `json:"guided_json"`
	GuidedRegex             json.RawMessage `json:"guided_regex"`
	GuidedChoice            json.RawMessage `json:"guided_choice"`
	GuidedGrammar           json.RawMessage `json:"guided_grammar"`
	GuidedWhitespacePattern json.RawMessage `json:"guided_whitespace_pattern"`
	// GuidedDecodingBackend chooses vLLM's grammar library; every choice gives the
	// same language here, so it is accepted and has no effect.
	GuidedDecodingBackend json.RawMessage `json:"guided_decoding_backend"`
	StructuredOutputs     json.RawMessage `json:"structured_outputs"`
}

// outputFormat is a language asked of a choice's text (after any reasoning): a function
// that adds it to a grammar builder. param names the field it came from.
type outputFormat struct {
	param string
	build func(b *grammar.Builder) (grammar.Expr, error)
}

// format reads the structured-output fields: at most one of them may ask for a format.
func (f *formatFields) format() (*outputFormat, *apiError) {
	if !isNull(f.GuidedWhitespacePattern) {
		return nil, badRequest("guided_whitespace_pattern", "guided_whitespace_pattern is not supported: JSON outputs allow one space or a newline with up to 20 spaces or tabs between tokens.")
	}
	var out *outputFormat
	set := func(of *outputFormat, aerr *apiError) *apiError {
		if aerr != nil || of == nil {
			return aerr
		}
		if out != nil {
			return badRequest(of.param, "Only one of response_format, guided_json, guided_regex, guided_choice, guided_grammar and structured_outputs may ask for a format; %s and %s both do.", out.param, of.param)
		}
		out = of
		return nil
	}
	if aerr := set(responseFormat(f.ResponseFormat)); aerr != nil {
		return nil, aerr
	}
	if !isNull(f.GuidedJSON) {
		if aerr := set(schemaFormat("guided_json", f.GuidedJSON, true)); aerr != nil {
			return nil, aerr
		}
	}
	if !isNull(f.GuidedRegex) {
		if aerr := set(regexFormat("guided_regex", f.GuidedRegex)); aerr != nil {
			return nil, aerr
		}
	}
	if !isNull(f.GuidedChoice) {
		if aerr := set(choiceFormat("guided_choice", f.GuidedChoice)); aerr != nil {
			return nil, aerr
		}
	}
	if !isNull(f.GuidedGrammar) {
		if aerr := set(grammarFormat("guided_grammar", f.GuidedGrammar)); aerr != nil {
			return nil, aerr
		}
	}
	if !isNull(f.StructuredOutputs) {
		if aerr := set(structuredOutputs(f.StructuredOutputs)); aerr != nil {
			return nil, aerr
		}
	}
	return out, nil
}

// responseFormat reads OpenAI's response_format: text (no format), json_object or
// json_schema (strict or not: the output is constrained either way).
func responseFormat(raw json.RawMessage) (*outputFormat, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	var rf struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict *bool           `json:"strict"`
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(raw, &rf); err != nil {
		return nil, badRequest("response_format", "response_format must be an object {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}.")
	}
	switch rf.Type {
	case "text":
		return nil, nil
	case "json_object":
		return jsonObjectFormat("response_format"), nil
	case "json_schema":
		if rf.JSONSchema == nil || isNull(rf.JSONSchema.Schema) {
			return nil, badRequest("response_format.json_schema.schema", "response_format.json_schema.schema is required for type json_schema.")
		}
		return schemaFormat("response_format.json_schema.schema", rf.JSONSchema.Schema, false)
	case "":
		return nil, badRequest("response_format.type", "response_format.type is required.")
	}
	return nil, badRequest("response_format.type", "response_format type %q is not supported (use text, json_object or json_schema).", rf.Type)
}

func jsonObjectFormat(param string) *outputFormat {
	return &outputFormat{param: param, build: func(b *grammar.Builder) (grammar.Expr, error) {
		return grammar.Seq(b.JSONSpace(), b.AnyJSONObject()), nil
	}}
}

// schemaFormat is a JSON Schema's format; with textOK the schema may also come as a
// string holding its JSON (vLLM's guided_json accepts both). The schema is compiled
// here once, so that an unsupported keyword is refused before any work.
func schemaFormat(param string, raw json.RawMessage, textOK bool) (*outputFormat, *apiError) {
	schema := []byte(raw)
	var s string
	if textOK && json.Unmarshal(raw, &s) == nil {
		schema = []byte(s)
	}
	of := &outputFormat{param: param, build: func(b *grammar.Builder) (grammar.Expr, error) {
		x, err := b.JSONSchema(schema)
		if err != nil {
			return grammar.Expr{}, err
		}
		return grammar.Seq(b.JSONSpace(), x), nil
	}}
	return of, of.check()
}

func regexFormat(param string, raw json.RawMessage) (*outputFormat, *apiError) {
	var pattern string
	if json.Unmarshal(raw, &pattern) != nil {
		return nil, badRequest(param, "%s must be a string (a regular expression).", param)
	}
	of := &outputFormat{param: param, build: func(b *grammar.Builder) (grammar.Expr, error) { return b.Regex(pattern) }}
	return of, of.check()
}

func choiceFormat(param string, raw json.RawMessage) (*outputFormat, *apiError) {
	var choices []string
	if json.Unmarshal(raw, &choices) != nil || len(choices) == 0 {
		return nil, badRequest(param, "%s must be a non-empty list of strings.", param)
	}
	of := &outputFormat{param: param, build: func(b *grammar.Builder) (grammar.Expr, error) {
		alts := make([]grammar.Expr, len(choices))
		for i, c := range choices {
			alts[i] = grammar.Lit(c)
		}
		return grammar.Alt(alts...), nil
	}}
	return of, of.check()
}

func grammarFormat(param string, raw json.RawMessage) (*outputFormat, *apiError) {
	var src string
	if json.Unmarshal(raw, &src) != nil {
		return nil, badRequest(param, "%s must be a string (a grammar in GBNF).", param)
	}
	g, err := grammar.ParseGBNF(src)
	if err != nil {
		return nil, badRequest(param, "%s: %v (the grammar is GBNF, llama.cpp's format: see docs/structured-outputs.md).", param, trimPrefixes(err))
	}
	of := &outputFormat{param: param, build: func(b *grammar.Builder) (grammar.Expr, error) { return b.Include(g), nil }}
	return of, of.check()
}

// structuredOutputs reads vLLM's structured_outputs object: one of json, regex, choice,
// grammar or json_object.
func structuredOutputs(raw json.RawMessage) (*outputFormat, *apiError) {
	var so map[string]json.RawMessage
	if json.Unmarshal(raw, &so) != nil {
		return nil, badRequest("structured_outputs", "structured_outputs must be an object with one of json, regex, choice, grammar or json_object.")
	}
	for _, k := range []string{"structural_tag", "whitespace_pattern"} {
		if !isNull(so[k]) {
			return nil, badRequest("structured_outputs."+k, "structured_outputs.%s is not supported.", k)
		}
	}
	for _, k := range []string{"disable_any_whitespace", "disable_additional_properties", "disable_fallback"} {
		if v := bytes.TrimSpace(so[k]); !isNull(v) && string(v) != "false" {
			return nil, badRequest("structured_outputs."+k, "structured_outputs.%s is not supported (only false).", k)
		}
	}
	var out *outputFormat
	var aerr *apiError
	n := 0
	for _, k := range []string{"json", "regex", "choice", "grammar", "json_object"} {
		v := so[k]
		if isNull(v) {
			continue
		}
		param := "structured_outputs." + k
		n++
		switch k {
		case "json":
			out, aerr = schemaFormat(param, v, true)
		case "regex":
			out, aerr = regexFormat(param, v)
		case "choice":
			out, aerr = choiceFormat(param, v)
		case "grammar":
			out, aerr = grammarFormat(param, v)
		case "json_object":
			if string(bytes.TrimSpace(v)) != "true" {
				n--
				continue
			}
			out = jsonObjectFormat(param)
		}
		if aerr != nil {
			return nil, aerr
		}
	}
	switch n {
	case 0:
		return nil, badRequest("structured_outputs", "structured_outputs must set one of json, regex, choice, grammar or json_object.")
	case 1:
		return out, nil
	}
	return nil, badRequest("structured_outputs", "structured_outputs may set only one of json, regex, choice, grammar and json_object.")
}

// check builds and compiles the format alone, so that a bad one is refused at once.
func (of *outputFormat) check() *apiError {
	b := grammar.NewBuilder()
	x, err := of.build(b)
	if err == nil {
		var g *grammar.Grammar
		if g, err = b.Build(x); err == nil {
			_, err = grammar.Compile(g)
		}
	}
	if err != nil {
		return badRequest(of.param, "%s: %v.", of.param, trimPrefixes(err))
	}
	return nil
}

// trimPrefixes drops the package prefixes of a grammar error, and its wrapped
// "unsupported" marker, for a client's message.
func trimPrefixes(err error) string {
	s := err.Error()
	s = strings.TrimPrefix(s, "grammar: ")
	s = strings.TrimSuffix(s, ": "+grammar.ErrUnsupported.Error())
	return s
}

// refusedFields are fields of the OpenAI and vLLM APIs that change the output and that
// this server does not implement: a request that sets one to anything but its neutral
// value gets a 400 naming it, rather than an answer as if it were absent.
type refusedFields struct {
	BadWords                   json.RawMessage `json:"bad_words"`
	UseBeamSearch              json.RawMessage `json:"use_beam_search"`
	LengthPenalty              json.RawMessage `json:"length_penalty"`
	TruncatePromptTokens       json.RawMessage `json:"truncate_prompt_tokens"`
	SkipSpecialTokens          json.RawMessage `json:"skip_special_tokens"`
	SpacesBetweenSpecialTokens json.RawMessage `json:"spaces_between_special_tokens"`
	LogitsProcessors           json.RawMessage `json:"logits_processors"`
	MMProcessorKwargs          json.RawMessage `json:"mm_processor_kwargs"`
}

// chatRefusedFields are the chat-only ones.
type chatRefusedFields struct {
	Documents        json.RawMessage `json:"documents"`
	ChatTemplate     json.RawMessage `json:"chat_template"`
	Functions        json.RawMessage `json:"functions"`
	FunctionCall     json.RawMessage `json:"function_call"`
	Audio            json.RawMessage `json:"audio"`
	Modalities       json.RawMessage `json:"modalities"`
	WebSearchOptions json.RawMessage `json:"web_search_options"`
}

type refusal struct {
	name    string
	raw     json.RawMessage
	neutral []string // compact JSON values that mean the default
	why     string
}

func (r *refusedFields) list() []refusal {
	return []refusal{
		{"bad_words", r.BadWords, []string{"[]"}, "bad words are not banned yet"},
		{"use_beam_search", r.UseBeamSearch, []string{"false"}, "beam search is not implemented"},
		{"length_penalty", r.LengthPenalty, []string{"1"}, "length_penalty applies to beam search, which is not implemented"},
		{"truncate_prompt_tokens", r.TruncatePromptTokens, nil, "prompts are not truncated; a prompt too long is refused"},
		{"skip_special_tokens", r.SkipSpecialTokens, []string{"true"}, "special tokens are always left out of the text"},
		{"spaces_between_special_tokens", r.SpacesBetweenSpecialTokens, []string{"true"}, "special tokens are left out of the text"},
		{"logits_processors", r.LogitsProcessors, []string{"[]"}, "custom logits processors are not supported"},
		{"mm_processor_kwargs", r.MMProcessorKwargs, nil, "this server serves text models only"},
	}
}

func (r *chatRefusedFields) list() []refusal {
	return []refusal{
		{"documents", r.Documents, nil, "documents are not passed to chat templates"},
		{"chat_template", r.ChatTemplate, nil, "a request may not bring its own chat template"},
		{"functions", r.Functions, nil, "the legacy functions field is not supported; use tools"},
		{"function_call", r.FunctionCall, nil, "the legacy function_call field is not supported; use tool_choice"},
		{"audio", r.Audio, nil, "this server serves text only"},
		{"modalities", r.Modalities, []string{`["text"]`}, "this server serves text only"},
		{"web_search_options", r.WebSearchOptions, nil, "web search is not available"},
	}
}

// refuse returns the 400 for the first field set to a value that is not neutral.
func refuse(list []refusal) *apiError {
	for _, r := range list {
		if isNull(r.raw) || neutral(r.raw, r.neutral) {
			continue
		}
		return badRequest(r.name, "%s is not supported by this server: %s.", r.name, r.why)
	}
	return nil
}

// neutral reports whether raw is one of the neutral values (numbers compared as numbers).
func neutral(raw json.RawMessage, values []string) bool {
	var buf bytes.Buffer
	if json.Compact(&buf, raw) != nil {
		return false
	}
	got := buf.String()
	a, errA := strconv.ParseFloat(got, 64)
	for _, v := range values {
		if got == v {
			return true
		}
		b, errB := strconv.ParseFloat(v, 64)
		if errA == nil && errB == nil && a == b {
			return true
		}
	}
	return false
}
