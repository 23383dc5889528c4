// Package schematest is a test helper for structured outputs: a JSON Schema validator for
// the keywords package grammar supports, written apart from it, and the schema test set.
package schematest

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"fmt"
	"math/big"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Case is one schema of the test set with values that must pass and fail it.
type Case struct {
	Name    string            `json:"name"`
	Schema  json.RawMessage   `json:"schema"`
	Valid   []json.RawMessage `json:"valid"`
	Invalid []json.RawMessage `json:"invalid"`
	// MaxTokens is enough tokens for any value the schema allows, with every string
	// and array at its largest (the test set bounds them), for generation tests.
	MaxTokens int `json:"max_tokens"`
}

//go:embed testdata/schemas.json
var casesJSON []byte

// Cases returns the test set.
func Cases() []Case {
	var cs []Case
	if err := json.Unmarshal(casesJSON, &cs); err != nil {
		panic("schematest: testdata/schemas.json: " + err.Error())
	}
	return cs
}

// Validate reports whether the JSON text doc is valid under schema (nil) or why not.
func Validate(doc, schema []byte) error {
	var v any
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		return fmt.Errorf("not JSON: %v", err)
	}
	if dec.More() {
		return fmt.Errorf("not JSON: data after the value")
	}
	var s any
	sdec := json.NewDecoder(bytes.NewReader(schema))
	sdec.UseNumber()
	if err := sdec.Decode(&s); err != nil {
		return fmt.Errorf("bad schema: %v", err)
	}
	return (&validator{root: s}).check(v, s, "$")
}

type validator struct{ root any }

func (vd *validator) check(v, s any, at string) error {
	switch s := s.(type) {
	case bool:
		if !s {
			return fmt.Errorf("%s: the schema false", at)
		}
		return nil
	case map[string]any:
		return vd.checkObj(v, s, at)
	}
	return fmt.Errorf("%s: bad schema %v", at, s)
}

func typeOf(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	case json.Number:
		if r, ok := new(big.Rat).SetString(string(x)); ok && r.IsInt() {
			return "integer"
		}
		return "number"
	}
	return "?"
}

func (vd *validator) checkObj(v any, s map[string]any, at string) error {
	if nb, _ := s["nullable"].(bool); nb && v == nil {
		return nil
	}
	if ref, ok := s["$ref"].(string); ok {
		target, err := vd.resolve(ref)
		if err != nil {
			return err
		}
		return vd.check(v, target, at)
	}
	if list, ok := s["anyOf"].([]any); ok {
		return vd.any(v, list, at, "anyOf")
	}
	if list, ok := s["oneOf"].([]any); ok {
		n := 0
		for _, sub := range list {
			if vd.check(v, sub, at) == nil {
				n++
			}
		}
		if n != 1 {
			return fmt.Errorf("%s: %d of oneOf match", at, n)
		}
	}
	if list, ok := s["allOf"].([]any); ok {
		for _, sub := range list {
			if err := vd.check(v, sub, at); err != nil {
				return err
			}
		}
	}
	if c, ok := s["const"]; ok && !equal(v, c) {
		return fmt.Errorf("%s: %v is not the const %v", at, v, c)
	}
	if list, ok := s["enum"].([]any); ok {
		found := false
		for _, e := range list {
			found = found || equal(v, e)
		}
		if !found {
			return fmt.Errorf("%s: %v is not in the enum", at, v)
		}
	}
	if t, ok := s["type"]; ok {
		var types []string
		switch t := t.(type) {
		case string:
			types = []string{t}
		case []any:
			for _, x := range t {
				types = append(types, x.(string))
			}
		}
		got := typeOf(v)
		ok := false
		for _, want := range types {
			ok = ok || want == got || want == "number" && got == "integer"
		}
		if !ok {
			return fmt.Errorf("%s: a %s, want %v", at, got, types)
		}
	}
	switch x := v.(type) {
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		for _, r := range asList(s["required"]) {
			if _, ok := x[r.(string)]; !ok {
				return fmt.Errorf("%s: required property %q missing", at, r)
			}
		}
		for k, val := range x {
			if ps, ok := props[k]; ok {
				if err := vd.check(val, ps, at+"."+k); err != nil {
					return err
				}
				continue
			}
			ap, has := s["additionalProperties"]
			if !has {
				continue
			}
			if err := vd.check(val, ap, at+"."+k); err != nil {
				return fmt.Errorf("%s: additional property %q: %v", at, k, err)
			}
		}
	case []any:
		if n, ok := num(s["minItems"]); ok && float64(len(x)) < n {
			return fmt.Errorf("%s: %d items, fewer than minItems %v", at, len(x), n)
		}
		if n, ok := num(s["maxItems"]); ok && float64(len(x)) > n {
			return fmt.Errorf("%s: %d items, more than maxItems %v", at, len(x), n)
		}
		prefix := asList(s["prefixItems"])
		for i, item := range x {
			sub, has := s["items"]
			if i < len(prefix) {
				sub, has = prefix[i], true
			}
			if has {
				if err := vd.check(item, sub, fmt.Sprintf("%s[%d]", at, i)); err != nil {
					return err
				}
			}
		}
	case string:
		n := float64(utf8.RuneCountInString(x))
		if m, ok := num(s["minLength"]); ok && n < m {
			return fmt.Errorf("%s: %q is shorter than minLength %v", at, x, m)
		}
		if m, ok := num(s["maxLength"]); ok && n > m {
			return fmt.Errorf("%s: %q is longer than maxLength %v", at, x, m)
		}
		if p, ok := s["pattern"].(string); ok {
			re, err := regexp.Compile(p)
			if err != nil {
				return fmt.Errorf("bad pattern %q", p)
			}
			if !re.MatchString(x) {
				return fmt.Errorf("%s: %q does not match %q", at, x, p)
			}
		}
		if f, ok := s["format"].(string); ok {
			if re, ok := formats[f]; ok && !re.MatchString(x) {
				return fmt.Errorf("%s: %q is not a %s", at, x, f)
			}
		}
	case json.Number:
		r, _ := new(big.Rat).SetString(string(x))
		cmp := func(key string, ok func(c int) bool) error {
			if b, has := s[key].(json.Number); has {
				br, _ := new(big.Rat).SetString(string(b))
				if !ok(r.Cmp(br)) {
					return fmt.Errorf("%s: %s violates %s %s", at, x, key, b)
				}
			}
			return nil
		}
		for _, c := range []error{
			cmp("minimum", func(c int) bool { return c >= 0 }),
			cmp("maximum", func(c int) bool { return c <= 0 }),
			cmp("exclusiveMinimum", func(c int) bool { return c > 0 }),
			cmp("exclusiveMaximum", func(c int) bool { return c < 0 }),
		} {
			if c != nil {
				return c
			}
		}
		if _, err := strconv.ParseFloat(string(x), 64); err != nil {
			return fmt.Errorf("%s: %s does not fit a float64", at, x)
		}
	}
	return nil
}

var formats = map[string]*regexp.Regexp{
	"date":      regexp.MustCompile(`^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$`),
	"date-time": regexp.MustCompile(`^\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d:[0-5]\d(\.\d+)?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)$`),
	"uuid":      regexp.MustCompile(`^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`),
}

func (vd *validator) any(v any, list []any, at, key string) error {
	var errs []string
	for _, sub := range list {
		err := vd.check(v, sub, at)
		if err == nil {
			return nil
		}
		errs = append(errs, err.Error())
	}
	return fmt.Errorf("%s: no %s matches: %s", at, key, strings.Join(errs, "; "))
}

func (vd *validator) resolve(ref string) (any, error) {
	frag, err := url.PathUnescape(strings.TrimPrefix(ref, "#"))
	if err != nil {
		return nil, err
	}
	cur := vd.root
	if frag == "" {
		return cur, nil
	}
	for _, tok := range strings.Split(strings.TrimPrefix(frag, "/"), "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		m, ok := cur.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("bad $ref %q", ref)
		}
		if cur, ok = m[tok]; !ok {
			return nil, fmt.Errorf("bad $ref %q", ref)
		}
	}
	return cur, nil
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func num(v any) (float64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	return f, err == nil
}

func equal(a, b any) bool {
	switch x := a.(type) {
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		rx, _ := new(big.Rat).SetString(string(x))
		ry, _ := new(big.Rat).SetString(string(y))
		return rx != nil && ry != nil && rx.Cmp(ry) == 0
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !equal(x[i], y[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			if !equal(v, y[k]) {
				return false
			}
		}
		return true
	}
	return a == b
}
