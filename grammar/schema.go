package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/big"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// JSON Schema support (drafts 7 to 2020-12, the keywords structured outputs use):
//
//	type (one or a list), enum, const, anyOf, oneOf (as anyOf), allOf of one schema,
//	$ref to "#", "#/$defs/…", "#/definitions/…" or any local JSON pointer (recursion
//	allowed), nullable (OpenAPI);
//	objects: properties (written in their declared order), required,
//	additionalProperties (false, true or a schema; absent means false when properties
//	are given, as OpenAI's strict mode and xgrammar have it);
//	arrays: items, prefixItems (and draft 7's items list), minItems, maxItems;
//	strings: minLength, maxLength, pattern (matched whole), format date, time,
//	date-time, uuid;
//	integers: minimum, maximum, exclusiveMinimum, exclusiveMaximum;
//	numbers: the same bounds when they are integers.
//
// Annotations (title, description, default, examples, …) are ignored, as are unknown
// keywords. Keywords that assert something this compiler cannot enforce are refused
// with an error naming them.
//
// Layout: whitespace between tokens is at most one space, or a newline and up to 20
// spaces or tabs (as llama.cpp's converter), so that no generation is whitespace
// without end; unbounded integers have at most 16 digits, fractions at most 16, and
// exponents at most 2, so that every number parses to a finite float64.

// MaxSchemaBytes bounds a schema's source.
const MaxSchemaBytes = 1 << 20

// maxSchemaDepth bounds the nesting of subschemas (not of $ref recursion).
const maxSchemaDepth = 64

// Keywords a schema may carry that assert nothing.
var schemaAnnotations = map[string]bool{
	"title": true, "description": true, "default": true, "examples": true, "$schema": true, "$id": true,
	"$comment": true, "deprecated": true, "readOnly": true, "writeOnly": true, "$defs": true, "definitions": true,
	"$anchor": true, "contentMediaType": true, "contentEncoding": true, "discriminator": true, "xml": true,
	"externalDocs": true, "example": true, "strict": true, "name": true,
}

// Keywords that assert something this compiler does not enforce.
var schemaUnsupported = []string{
	"not", "if", "then", "else", "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas",
	"dependencies", "minProperties", "maxProperties", "contains", "minContains", "maxContains", "multipleOf",
	"$dynamicRef", "$recursiveRef", "$dynamicAnchor", "$recursiveAnchor", "unevaluatedItems",
}

// JSONSchema returns the grammar of the JSON texts valid under schema, with optional
// whitespace before.
func JSONSchema(schema []byte) (*Grammar, error) {
	b := NewBuilder()
	x, err := b.JSONSchema(schema)
	if err != nil {
		return nil, err
	}
	return b.Build(Seq(b.JSONSpace(), x))
}

// JSONObject returns the grammar of any JSON object (OpenAI's json_object format), with
// optional whitespace before.
func JSONObject() *Grammar {
	b := NewBuilder()
	g, _ := b.Build(Seq(b.JSONSpace(), b.jsonCommon().object))
	return g
}

// JSONSchema adds the rules of schema to b and returns an expression for the JSON texts
// valid under it (without surrounding whitespace).
func (b *Builder) JSONSchema(schema []byte) (Expr, error) {
	if len(schema) > MaxSchemaBytes {
		return Expr{}, fmt.Errorf("json schema: %d bytes (at most %d)", len(schema), MaxSchemaBytes)
	}
	doc, err := decodeOrdered(schema)
	if err != nil {
		return Expr{}, fmt.Errorf("json schema: %w", err)
	}
	sc := &schemaConv{b: b, root: doc, refs: map[string]Expr{}}
	return sc.schema(doc, "#", 0)
}

// AnyJSON returns an expression for any JSON value.
func (b *Builder) AnyJSON() Expr { return b.jsonCommon().value }

// JSONSpace is the whitespace allowed between JSON tokens.
func (b *Builder) JSONSpace() Expr { return b.jsonCommon().ws }

// JSONString returns an expression for a JSON string literal of any content.
func (b *Builder) JSONString() Expr { return b.jsonCommon().str }

// jsonRules are the shared rules of JSON's syntax, made once per Builder.
type jsonRules struct {
	ws, str, char, number, integer, value, object, array Expr
}

func (b *Builder) jsonCommon() *jsonRules {
	if b.json != nil {
		return b.json
	}
	j := &jsonRules{}
	b.json = j
	j.ws = b.Rule("ws", Opt(Alt(Lit(" "), Seq(Lit("\n"), Repeat(Class(false, ' ', ' ', '\t', '\t'), 0, 20)))))
	hex := Class(false, '0', '9', 'a', 'f', 'A', 'F')
	j.char = b.Rule("char", Alt(
		Class(true, 0, 0x1F, '"', '"', '\\', '\\'),
		Seq(Lit(`\`), Alt(Class(false, '"', '"', '\\', '\\', '/', '/', 'b', 'b', 'f', 'f', 'n', 'n', 'r', 'r', 't', 't'), Seq(Lit("u"), Repeat(hex, 4, 4)))),
	))
	j.str = b.Rule("string", Seq(Lit(`"`), Star(j.char), Lit(`"`)))
	digit := Class(false, '0', '9')
	intPart := Alt(Lit("0"), Seq(Class(false, '1', '9'), Repeat(digit, 0, 15)))
	j.integer = b.Rule("integer", Seq(Opt(Lit("-")), intPart))
	j.number = b.Rule("number", Seq(Opt(Lit("-")), intPart, Opt(Seq(Lit("."), Repeat(digit, 1, 16))),
		Opt(Seq(Class(false, 'e', 'e', 'E', 'E'), Opt(Class(false, '+', '+', '-', '-')), Repeat(digit, 1, 2)))))
	j.value = b.Declare("value")
	j.object = b.Rule("object", Seq(Lit("{"), j.ws, Opt(Seq(b.anyMembers(j.value), j.ws)), Lit("}")))
	comma := Seq(j.ws, Lit(","), j.ws)
	j.array = b.Rule("array", Seq(Lit("["), j.ws, Opt(Seq(j.value, Star(Seq(comma, j.value)), j.ws)), Lit("]")))
	b.Define(j.value, Alt(j.object, j.array, j.str, j.number, Lit("true"), Lit("false"), Lit("null")))
	return j
}

// anyMembers is one or more "key": value members with values matching val.
func (b *Builder) anyMembers(val Expr) Expr {
	j := b.json
	member := Seq(j.str, j.ws, Lit(":"), j.ws, val)
	return Seq(member, Star(Seq(j.ws, Lit(","), j.ws, member)))
}

type schemaConv struct {
	b    *Builder
	root any
	refs map[string]Expr
}

// object is a JSON object decoded with its keys in order.
type object struct {
	keys []string
	vals map[string]any
}

func (o *object) get(k string) (any, bool) {
	v, ok := o.vals[k]
	return v, ok
}

func (sc *schemaConv) errorf(path, format string, args ...any) error {
	return unsupportedf(path, format, args...)
}

func badf(path, format string, args ...any) error {
	return fmt.Errorf("json schema: %s: %s", path, fmt.Sprintf(format, args...))
}

// schema converts the subschema s found at path.
func (sc *schemaConv) schema(s any, path string, depth int) (Expr, error) {
	if depth > maxSchemaDepth {
		return Expr{}, badf(path, "subschemas nested more than %d deep", maxSchemaDepth)
	}
	switch s := s.(type) {
	case bool:
		if s {
			return sc.b.AnyJSON(), nil
		}
		return Expr{}, badf(path, "the schema false allows no value")
	case *object:
		return sc.object(s, path, depth)
	}
	return Expr{}, badf(path, "a schema must be an object or a boolean")
}

func (sc *schemaConv) object(s *object, path string, depth int) (Expr, error) {
	for _, k := range schemaUnsupported {
		if _, ok := s.get(k); ok {
			return Expr{}, sc.errorf(path, "the keyword %q is not supported", k)
		}
	}
	if v, ok := s.get("uniqueItems"); ok && v != false {
		return Expr{}, sc.errorf(path, "the keyword \"uniqueItems\" is not supported")
	}
	if v, ok := s.get("unevaluatedProperties"); ok && v != false {
		return Expr{}, sc.errorf(path, "the keyword \"unevaluatedProperties\" is only supported as false")
	}
	// siblings: the keywords besides annotations and key, which must come alone.
	alone := func(key string) error {
		for _, k := range s.keys {
			if k != key && !schemaAnnotations[k] && k != "unevaluatedProperties" && k != "nullable" {
				return sc.errorf(path, "%q together with %q is not supported (put the constraints inside it)", key, k)
			}
		}
		return nil
	}
	nullable := false
	if v, ok := s.get("nullable"); ok {
		nb, isBool := v.(bool)
		if !isBool {
			return Expr{}, badf(path+"/nullable", "must be a boolean")
		}
		nullable = nb
	}
	orNull := func(x Expr) Expr {
		if nullable {
			return Alt(x, Lit("null"))
		}
		return x
	}
	if ref, ok := s.get("$ref"); ok {
		if err := alone("$ref"); err != nil {
			return Expr{}, err
		}
		r, ok := ref.(string)
		if !ok {
			return Expr{}, badf(path+"/$ref", "must be a string")
		}
		x, err := sc.ref(r, path, depth)
		return orNull(x), err
	}
	for _, key := range []string{"anyOf", "oneOf", "allOf"} {
		v, ok := s.get(key)
		if !ok {
			continue
		}
		if err := alone(key); err != nil {
			return Expr{}, err
		}
		list, ok := v.([]any)
		if !ok || len(list) == 0 {
			return Expr{}, badf(path+"/"+key, "must be a non-empty list of schemas")
		}
		if key == "allOf" && len(list) > 1 {
			return Expr{}, sc.errorf(path, "allOf with more than one schema is not supported")
		}
		alts := make([]Expr, 0, len(list))
		for i, sub := range list {
			x, err := sc.schema(sub, fmt.Sprintf("%s/%s/%d", path, key, i), depth+1)
			if err != nil {
				return Expr{}, err
			}
			alts = append(alts, x)
		}
		return orNull(Alt(alts...)), nil
	}
	if v, ok := s.get("const"); ok {
		lit, err := canonicalJSON(v)
		if err != nil {
			return Expr{}, badf(path+"/const", "%v", err)
		}
		return orNull(Lit(lit)), nil
	}
	if v, ok := s.get("enum"); ok {
		list, ok := v.([]any)
		if !ok || len(list) == 0 {
			return Expr{}, badf(path+"/enum", "must be a non-empty list")
		}
		alts := make([]Expr, 0, len(list))
		for _, e := range list {
			lit, err := canonicalJSON(e)
			if err != nil {
				return Expr{}, badf(path+"/enum", "%v", err)
			}
			alts = append(alts, Lit(lit))
		}
		return orNull(Alt(alts...)), nil
	}

	var types []string
	switch t := s.vals["type"].(type) {
	case nil:
		if _, ok := s.get("type"); ok {
			return Expr{}, badf(path+"/type", "must be a type name or a list of them")
		}
		types = inferTypes(s)
	case string:
		types = []string{t}
	case []any:
		for _, x := range t {
			name, ok := x.(string)
			if !ok {
				return Expr{}, badf(path+"/type", "must be a type name or a list of them")
			}
			types = append(types, name)
		}
		if len(types) == 0 {
			return Expr{}, badf(path+"/type", "an empty list of types allows no value")
		}
	default:
		return Expr{}, badf(path+"/type", "must be a type name or a list of them")
	}
	if nullable && !slices.Contains(types, "null") && len(types) > 0 {
		types = append(types, "null")
	}
	if len(types) == 0 {
		return sc.b.AnyJSON(), nil
	}
	alts := make([]Expr, 0, len(types))
	for _, t := range types {
		var x Expr
		var err error
		switch t {
		case "object":
			x, err = sc.objectType(s, path, depth)
		case "array":
			x, err = sc.arrayType(s, path, depth)
		case "string":
			x, err = sc.stringType(s, path)
		case "integer":
			x, err = sc.numberType(s, path, true)
		case "number":
			x, err = sc.numberType(s, path, false)
		case "boolean":
			x = Alt(Lit("true"), Lit("false"))
		case "null":
			x = Lit("null")
		default:
			return Expr{}, badf(path+"/type", "unknown type %q", t)
		}
		if err != nil {
			return Expr{}, err
		}
		alts = append(alts, x)
	}
	return Alt(alts...), nil
}

// inferTypes guesses a schema's type from its keywords when it has no "type".
func inferTypes(s *object) []string {
	has := func(keys ...string) bool {
		for _, k := range keys {
			if _, ok := s.get(k); ok {
				return true
			}
		}
		return false
	}
	var types []string
	if has("properties", "additionalProperties", "required") {
		types = append(types, "object")
	}
	if has("items", "prefixItems", "minItems", "maxItems") {
		types = append(types, "array")
	}
	if has("pattern", "minLength", "maxLength", "format") {
		types = append(types, "string")
	}
	if has("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") {
		types = append(types, "number")
	}
	return types
}

// ref resolves a local reference to a rule (made once per target, so recursion works).
func (sc *schemaConv) ref(r, path string, depth int) (Expr, error) {
	if !strings.HasPrefix(r, "#") {
		return Expr{}, sc.errorf(path+"/$ref", "only local references (#…) are supported, got %q", r)
	}
	frag, err := url.PathUnescape(r[1:])
	if err != nil {
		return Expr{}, badf(path+"/$ref", "bad reference %q", r)
	}
	if x, ok := sc.refs[frag]; ok {
		return x, nil
	}
	target := sc.root
	if frag != "" {
		if !strings.HasPrefix(frag, "/") {
			return Expr{}, sc.errorf(path+"/$ref", "references to anchors (%q) are not supported", r)
		}
		for _, tok := range strings.Split(frag[1:], "/") {
			tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
			switch t := target.(type) {
			case *object:
				v, ok := t.get(tok)
				if !ok {
					return Expr{}, badf(path+"/$ref", "%q points to nothing", r)
				}
				target = v
			case []any:
				i, err := strconv.Atoi(tok)
				if err != nil || i < 0 || i >= len(t) {
					return Expr{}, badf(path+"/$ref", "%q points to nothing", r)
				}
				target = t[i]
			default:
				return Expr{}, badf(path+"/$ref", "%q points to nothing", r)
			}
		}
	}
	name := "ref"
	if i := strings.LastIndexByte(frag, '/'); i >= 0 {
		name = frag[i+1:]
	}
	rule := sc.b.Declare(name)
	sc.refs[frag] = rule
	body, err := sc.schema(target, r, depth+1)
	if err != nil {
		return Expr{}, err
	}
	sc.b.Define(rule, body)
	return rule, nil
}

func (sc *schemaConv) objectType(s *object, path string, depth int) (Expr, error) {
	j := sc.b.jsonCommon()
	props := &object{vals: map[string]any{}}
	if v, ok := s.get("properties"); ok {
		p, ok := v.(*object)
		if !ok {
			return Expr{}, badf(path+"/properties", "must be an object")
		}
		props = p
	}
	required := map[string]bool{}
	if v, ok := s.get("required"); ok {
		list, ok := v.([]any)
		if !ok {
			return Expr{}, badf(path+"/required", "must be a list of property names")
		}
		for _, x := range list {
			name, ok := x.(string)
			if !ok {
				return Expr{}, badf(path+"/required", "must be a list of property names")
			}
			if _, declared := props.get(name); !declared {
				// A required property without a schema may be any value.
				props.keys = append(props.keys, name)
				props.vals[name] = true
			}
			required[name] = true
		}
	}
	// Extra members: additionalProperties, false by default when properties are given.
	var extra Expr
	hasExtra := len(props.keys) == 0
	if v, ok := s.get("additionalProperties"); ok {
		switch v {
		case false:
			hasExtra = false
		case true:
			hasExtra = true
		default:
			x, err := sc.schema(v, path+"/additionalProperties", depth+1)
			if err != nil {
				return Expr{}, err
			}
			extra, hasExtra = x, true
		}
	}
	if hasExtra && extra.e == nil {
		extra = j.value
	}
	if len(props.keys) == 0 {
		if !hasExtra {
			return Lit("{}"), nil
		}
		return Seq(Lit("{"), j.ws, Opt(Seq(sc.b.anyMembers(extra), j.ws)), Lit("}")), nil
	}
	comma := Seq(j.ws, Lit(","), j.ws)
	kvs := make([]Expr, len(props.keys))
	for i, k := range props.keys {
		x, err := sc.schema(props.vals[k], path+"/properties/"+escapePointer(k), depth+1)
		if err != nil {
			return Expr{}, err
		}
		key, _ := canonicalJSON(k)
		kvs[i] = Seq(Lit(key), j.ws, Lit(":"), j.ws, x)
	}
	extraMember := Seq(j.str, j.ws, Lit(":"), j.ws, extra)
	// tail[i]: the members from i on, each after a comma (something came before).
	// head[i]: the members from i on, the first of them without a comma.
	n := len(kvs)
	tail := make([]Expr, n+1)
	head := make([]Expr, n+1)
	if hasExtra {
		tail[n] = Star(Seq(comma, extraMember))
		head[n] = Seq(extraMember, tail[n])
	}
	anyRequired := false
	for i := n - 1; i >= 0; i-- {
		name := props.keys[i]
		t := Seq(comma, kvs[i], tail[i+1])
		h := Seq(kvs[i], tail[i+1])
		if !required[name] {
			t = Alt(t, tail[i+1])
			if head[i+1].e != nil || hasExtra {
				h = Alt(h, head[i+1])
			}
		} else {
			anyRequired = true
		}
		// Rules, so that each tail is written once however many heads refer to it.
		tail[i] = sc.b.Rule("obj-tail", t)
		head[i] = sc.b.Rule("obj-head", h)
	}
	if anyRequired {
		return Seq(Lit("{"), j.ws, head[0], j.ws, Lit("}")), nil
	}
	return Seq(Lit("{"), j.ws, Opt(Seq(head[0], j.ws)), Lit("}")), nil
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// count reads a non-negative integer keyword.
func count(s *object, key, path string) (int, bool, error) {
	v, ok := s.get(key)
	if !ok {
		return 0, false, nil
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, false, badf(path+"/"+key, "must be a non-negative integer")
	}
	i, err := strconv.ParseInt(string(n), 10, 64)
	if err != nil {
		f, ferr := n.Float64()
		if ferr != nil || f != math.Trunc(f) {
			return 0, false, badf(path+"/"+key, "must be a non-negative integer")
		}
		i = int64(f)
	}
	if i < 0 {
		return 0, false, badf(path+"/"+key, "must be a non-negative integer")
	}
	if i > MaxRepeat {
		return 0, false, unsupportedf(path, "%s %d is more than %d", key, i, MaxRepeat)
	}
	return int(i), true, nil
}

func unsupportedf(path, format string, args ...any) error {
	return fmt.Errorf("json schema: %s: %s: %w", path, fmt.Sprintf(format, args...), ErrUnsupported)
}

func (sc *schemaConv) arrayType(s *object, path string, depth int) (Expr, error) {
	j := sc.b.jsonCommon()
	minItems, _, err := count(s, "minItems", path)
	if err != nil {
		return Expr{}, err
	}
	maxItems, hasMax, err := count(s, "maxItems", path)
	if err != nil {
		return Expr{}, err
	}
	if hasMax && maxItems < minItems {
		return Expr{}, badf(path, "maxItems %d is below minItems %d: no array is valid", maxItems, minItems)
	}
	var prefix []Expr
	itemsKey := "items"
	pv, hasPrefix := s.get("prefixItems")
	if list, isList := s.vals["items"].([]any); isList { // draft 7 tuples
		pv, hasPrefix, itemsKey = list, true, "additionalItems"
	}
	if hasPrefix {
		list, ok := pv.([]any)
		if !ok {
			return Expr{}, badf(path+"/prefixItems", "must be a list of schemas")
		}
		for i, sub := range list {
			x, err := sc.schema(sub, fmt.Sprintf("%s/prefixItems/%d", path, i), depth+1)
			if err != nil {
				return Expr{}, err
			}
			prefix = append(prefix, x)
		}
	}
	item := j.value
	itemsAllowed := !hasPrefix // after a tuple, no more items unless items says so
	if v, ok := s.get(itemsKey); ok {
		switch v {
		case false:
			itemsAllowed = false
		case true:
			itemsAllowed = true
		default:
			x, err := sc.schema(v, path+"/"+itemsKey, depth+1)
			if err != nil {
				return Expr{}, err
			}
			item, itemsAllowed = x, true
		}
	}
	k := len(prefix)
	if !itemsAllowed {
		if minItems > k {
			return Expr{}, badf(path, "minItems %d needs more items than the %d the schema allows", minItems, k)
		}
		if !hasMax || maxItems > k {
			maxItems, hasMax = k, true
		}
	}
	elem := func(i int) Expr {
		if i < k {
			return prefix[i]
		}
		return item
	}
	comma := Seq(j.ws, Lit(","), j.ws)
	if hasMax && maxItems == 0 {
		return Seq(Lit("["), j.ws, Lit("]")), nil
	}
	// The list of elements, built from its end: rest is what may follow element i-1.
	n0 := max(minItems, k) // elements written out one by one
	if hasMax {
		n0 = min(n0, maxItems)
	}
	var rest Expr
	switch {
	case n0 == 0:
		// No element is required and there is no prefix: item (, item)* bounded.
		more := -1
		if hasMax {
			more = maxItems - 1
		}
		list := Seq(item, Repeat(Seq(comma, item), 0, more))
		return Seq(Lit("["), j.ws, Opt(Seq(list, j.ws)), Lit("]")), nil
	case !hasMax:
		rest = Star(Seq(comma, item))
	default:
		rest = Repeat(Seq(comma, item), 0, maxItems-n0)
	}
	if n0 >= k && !itemsAllowed {
		rest = Expr{}
	}
	for i := n0 - 1; i >= 1; i-- {
		seg := Seq(comma, elem(i), rest)
		if i >= minItems {
			seg = Opt(seg)
		}
		rest = seg
	}
	list := Seq(elem(0), rest)
	if minItems == 0 {
		return Seq(Lit("["), j.ws, Opt(Seq(list, j.ws)), Lit("]")), nil
	}
	return Seq(Lit("["), j.ws, list, j.ws, Lit("]")), nil
}

func (sc *schemaConv) stringType(s *object, path string) (Expr, error) {
	j := sc.b.jsonCommon()
	minLen, hasMin, err := count(s, "minLength", path)
	if err != nil {
		return Expr{}, err
	}
	maxLen, hasMax, err := count(s, "maxLength", path)
	if err != nil {
		return Expr{}, err
	}
	if hasMax && maxLen < minLen {
		return Expr{}, badf(path, "maxLength %d is below minLength %d: no string is valid", maxLen, minLen)
	}
	if v, ok := s.get("pattern"); ok {
		p, ok := v.(string)
		if !ok {
			return Expr{}, badf(path+"/pattern", "must be a string")
		}
		if hasMin || hasMax {
			return Expr{}, sc.errorf(path, "pattern together with minLength or maxLength is not supported (put the length in the pattern)")
		}
		x, err := regexExpr(p, jsonChars)
		if err != nil {
			return Expr{}, fmt.Errorf("json schema: %s/pattern: %w", path, err)
		}
		return Seq(Lit(`"`), x, Lit(`"`)), nil
	}
	if v, ok := s.get("format"); ok {
		f, _ := v.(string)
		x, ok := sc.format(f)
		if !ok {
			return Expr{}, sc.errorf(path+"/format", "the format %q is not supported (supported: date, time, date-time, uuid)", f)
		}
		if hasMin || hasMax {
			return Expr{}, sc.errorf(path, "format together with minLength or maxLength is not supported")
		}
		return Seq(Lit(`"`), x, Lit(`"`)), nil
	}
	if !hasMin && !hasMax {
		return j.str, nil
	}
	hi := -1
	if hasMax {
		hi = maxLen
	}
	return Seq(Lit(`"`), Repeat(j.char, minLen, hi), Lit(`"`)), nil
}

func (sc *schemaConv) format(f string) (Expr, bool) {
	d := Class(false, '0', '9')
	two := func(a, b Expr) Expr { return Seq(a, b) }
	date := Seq(Repeat(d, 4, 4), Lit("-"), Alt(two(Lit("0"), Class(false, '1', '9')), two(Lit("1"), Class(false, '0', '2'))),
		Lit("-"), Alt(two(Lit("0"), Class(false, '1', '9')), two(Class(false, '1', '2'), d), two(Lit("3"), Class(false, '0', '1'))))
	hour := Alt(two(Class(false, '0', '1'), d), two(Lit("2"), Class(false, '0', '3')))
	minute := two(Class(false, '0', '5'), d)
	time := Seq(hour, Lit(":"), minute, Lit(":"), minute, Opt(Seq(Lit("."), Repeat(d, 1, 6))),
		Alt(Lit("Z"), Seq(Class(false, '+', '+', '-', '-'), hour, Lit(":"), minute)))
	hex := Class(false, '0', '9', 'a', 'f', 'A', 'F')
	switch f {
	case "date":
		return date, true
	case "time":
		return time, true
	case "date-time":
		return Seq(date, Lit("T"), time), true
	case "uuid":
		return Seq(Repeat(hex, 8, 8), Lit("-"), Repeat(hex, 4, 4), Lit("-"), Repeat(hex, 4, 4), Lit("-"), Repeat(hex, 4, 4), Lit("-"), Repeat(hex, 12, 12)), true
	}
	return Expr{}, false
}

// maxDigits bounds the digits of an integer part, and so the numbers a bound may name.
const maxDigits = 16

var maxMagnitude = new(big.Int).Sub(new(big.Int).Exp(big.NewInt(10), big.NewInt(maxDigits), nil), big.NewInt(1))

// bound is a numeric bound: an integer value, inclusive or not.
type bound struct {
	set  bool
	v    *big.Int
	incl bool
}

func (sc *schemaConv) numberType(s *object, path string, integer bool) (Expr, error) {
	j := sc.b.jsonCommon()
	var lo, hi bound
	read := func(key string, isMin, incl bool) error {
		v, ok := s.get(key)
		if !ok {
			return nil
		}
		if b, isBool := v.(bool); isBool { // draft 4: exclusiveMinimum: true modifies minimum
			if b {
				if isMin {
					lo.incl = false
				} else {
					hi.incl = false
				}
			}
			return nil
		}
		n, ok := v.(json.Number)
		if !ok {
			return badf(path+"/"+key, "must be a number")
		}
		r, ok := new(big.Rat).SetString(string(n))
		if !ok {
			return badf(path+"/"+key, "must be a number")
		}
		var iv *big.Int
		if r.IsInt() {
			iv = new(big.Int).Set(r.Num())
		} else if integer {
			// Round inward: an integer ≥ 2.5 is ≥ 3.
			f := new(big.Int).Quo(r.Num(), r.Denom()) // toward zero
			if isMin && r.Sign() > 0 || !isMin && r.Sign() < 0 {
				if isMin {
					f.Add(f, big.NewInt(1))
				} else {
					f.Sub(f, big.NewInt(1))
				}
			}
			iv, incl = f, true
		} else {
			return sc.errorf(path+"/"+key, "a bound that is not an integer (%s) is not supported on numbers", n)
		}
		if new(big.Int).Abs(iv).Cmp(maxMagnitude) > 0 {
			return sc.errorf(path+"/"+key, "a bound beyond %d digits is not supported", maxDigits)
		}
		b := bound{set: true, v: iv, incl: incl}
		if isMin {
			if !lo.set || iv.Cmp(lo.v) > 0 || iv.Cmp(lo.v) == 0 && !incl {
				lo = b
			}
		} else if !hi.set || iv.Cmp(hi.v) < 0 || iv.Cmp(hi.v) == 0 && !incl {
			hi = b
		}
		return nil
	}
	// draft 4 booleans first need the values they modify.
	lo.incl, hi.incl = true, true
	for _, k := range []struct {
		key        string
		isMin, inc bool
	}{{"minimum", true, true}, {"maximum", false, true}, {"exclusiveMinimum", true, false}, {"exclusiveMaximum", false, false}} {
		if err := read(k.key, k.isMin, k.inc); err != nil {
			return Expr{}, err
		}
	}
	if !lo.set && !hi.set {
		if integer {
			return j.integer, nil
		}
		return j.number, nil
	}
	if integer {
		// Integer bounds are inclusive.
		if lo.set && !lo.incl {
			lo = bound{true, new(big.Int).Add(lo.v, big.NewInt(1)), true}
		}
		if hi.set && !hi.incl {
			hi = bound{true, new(big.Int).Sub(hi.v, big.NewInt(1)), true}
		}
		if lo.set && hi.set && lo.v.Cmp(hi.v) > 0 {
			return Expr{}, badf(path, "no integer lies within the bounds")
		}
		return intRange(lo, hi), nil
	}
	if lo.set && hi.set && (lo.v.Cmp(hi.v) > 0 || lo.v.Cmp(hi.v) == 0 && !(lo.incl && hi.incl)) {
		return Expr{}, badf(path, "no number lies within the bounds")
	}
	return numRange(lo, hi), nil
}

// intRange is the integers in [lo, hi] (inclusive bounds; unset means ±maxMagnitude).
func intRange(lo, hi bound) Expr {
	l, h := lo.v, hi.v
	if !lo.set {
		l = new(big.Int).Neg(maxMagnitude)
	}
	if !hi.set {
		h = maxMagnitude
	}
	var alts []Expr
	zero := big.NewInt(0)
	if l.Sign() < 0 { // negatives: "-" then |x| in [max(1, -h), -l]
		nl := new(big.Int).Neg(h)
		if nl.Cmp(big.NewInt(1)) < 0 {
			nl = big.NewInt(1)
		}
		alts = append(alts, Seq(Lit("-"), digitsRange(nl.String(), new(big.Int).Neg(l).String())))
	}
	if h.Sign() >= 0 {
		nl := l
		if nl.Sign() < 0 {
			nl = zero
		}
		alts = append(alts, digitsRange(nl.String(), h.String()))
	}
	return Alt(alts...)
}

// numRange is the decimal numbers within integer bounds: an integer part and an optional
// fraction of up to 16 digits, no exponent.
func numRange(lo, hi bound) Expr {
	var alts []Expr
	if !lo.set || lo.v.Sign() < 0 {
		// Negatives: "-" then y = -x in (0, -lo] (or unbounded), above -hi.
		var yl bound
		switch {
		case hi.set && hi.v.Sign() < 0:
			yl = bound{true, new(big.Int).Neg(hi.v), hi.incl}
		default:
			yl = bound{true, big.NewInt(0), false}
		}
		yh := bound{}
		if lo.set {
			yh = bound{true, new(big.Int).Neg(lo.v), lo.incl}
		}
		if x := nonNegRange(yl, yh); x.e != nil {
			alts = append(alts, Seq(Lit("-"), x))
		}
	}
	if !hi.set || hi.v.Sign() >= 0 {
		xl := lo
		if !lo.set || lo.v.Sign() < 0 {
			xl = bound{true, big.NewInt(0), true}
		}
		if x := nonNegRange(xl, hi); x.e != nil {
			alts = append(alts, x)
		}
	}
	return Alt(alts...)
}

// nonNegRange is the non-negative decimals x with lo ≤ x ≤ hi (lo set and ≥ 0; hi unset
// means unbounded; each bound inclusive or not). A nil Expr means none.
func nonNegRange(lo, hi bound) Expr {
	digit := Class(false, '0', '9')
	anyFrac := Opt(Seq(Lit("."), Repeat(digit, 1, 16)))
	zeroFrac := Opt(Seq(Lit("."), Repeat(Lit("0"), 1, 16)))
	nonZeroFrac := Seq(Lit("."), Repeat(Lit("0"), 0, 15), Class(false, '1', '9'), Repeat(digit, 0, 15))
	one := big.NewInt(1)
	var alts []Expr
	L := lo.v
	H := maxMagnitude
	if hi.set {
		H = hi.v
	}
	if hi.set && L.Cmp(H) == 0 {
		if lo.incl && hi.incl {
			return Seq(digitsRange(L.String(), L.String()), zeroFrac)
		}
		return Expr{}
	}
	// The integer part L: L itself and L.xxx, or only above L.
	if lo.incl {
		alts = append(alts, Seq(digitsRange(L.String(), L.String()), anyFrac))
	} else {
		alts = append(alts, Seq(digitsRange(L.String(), L.String()), nonZeroFrac))
	}
	// Integer parts strictly between.
	a, b := new(big.Int).Add(L, one), H
	if hi.set {
		b = new(big.Int).Sub(H, one)
	}
	if a.Cmp(b) <= 0 {
		alts = append(alts, Seq(digitsRange(a.String(), b.String()), anyFrac))
	}
	// The integer part H (only H itself, with zeros after the point).
	if hi.set && hi.incl {
		alts = append(alts, Seq(digitsRange(H.String(), H.String()), zeroFrac))
	}
	return Alt(alts...)
}

// digitsRange is the decimal numerals (no leading zeros) of the integers in [lo, hi],
// 0 ≤ lo ≤ hi, given as decimal strings.
func digitsRange(lo, hi string) Expr {
	var alts []Expr
	for n := len(lo); n <= len(hi); n++ {
		a, b := lo, hi
		if n > len(lo) {
			a = "1" + strings.Repeat("0", n-1)
		}
		if n < len(hi) {
			b = strings.Repeat("9", n)
		}
		alts = append(alts, sameLength(a, b))
	}
	return Alt(alts...)
}

// sameLength is the numerals of the integers in [a, b], both n digits long.
func sameLength(a, b string) Expr {
	if a == b {
		return Lit(a)
	}
	if strings.Trim(a, "0") == "" && strings.Trim(b, "9") == "" {
		return Repeat(Class(false, '0', '9'), len(a), len(a))
	}
	if len(a) == 1 {
		return Class(false, rune(a[0]), rune(b[0]))
	}
	if a[0] == b[0] {
		return Seq(Lit(a[:1]), sameLength(a[1:], b[1:]))
	}
	n := len(a) - 1
	digit := Class(false, '0', '9')
	var alts []Expr
	alts = append(alts, Seq(Lit(a[:1]), sameLength(a[1:], strings.Repeat("9", n))))
	if a[0]+1 <= b[0]-1 {
		alts = append(alts, Seq(Class(false, rune(a[0]+1), rune(b[0]-1)), Repeat(digit, n, n)))
	}
	alts = append(alts, Seq(Lit(b[:1]), sameLength(strings.Repeat("0", n), b[1:])))
	return Alt(alts...)
}

// canonicalJSON writes a decoded value compactly, objects with their keys in order.
func canonicalJSON(v any) (string, error) {
	var buf bytes.Buffer
	if err := writeJSON(&buf, v); err != nil {
		return "", err
	}
	return buf.String(), nil
}

func writeJSON(buf *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		buf.WriteString(strconv.FormatBool(v))
	case json.Number:
		buf.WriteString(string(v))
	case string:
		enc := json.NewEncoder(buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			return err
		}
		buf.Truncate(buf.Len() - 1) // Encode's newline
	case []any:
		buf.WriteByte('[')
		for i, x := range v {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeJSON(buf, x); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case *object:
		buf.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeJSON(buf, k); err != nil {
				return err
			}
			buf.WriteByte(':')
			if err := writeJSON(buf, v.vals[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	default:
		return fmt.Errorf("cannot encode %T", v)
	}
	return nil
}

// decodeOrdered decodes JSON with numbers kept as written and objects' keys in order.
func decodeOrdered(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("unexpected data after the schema")
	}
	return v, nil
}

const maxJSONDepth = 512

func decodeValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxJSONDepth {
		return nil, fmt.Errorf("nested more than %d deep", maxJSONDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		if err == io.EOF {
			return nil, fmt.Errorf("unexpected end of JSON")
		}
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			o := &object{vals: map[string]any{}}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, ok := kt.(string)
				if !ok {
					return nil, fmt.Errorf("object key is not a string")
				}
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				if _, dup := o.vals[k]; !dup {
					o.keys = append(o.keys, k)
				}
				o.vals[k] = v
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return o, nil
		case '[':
			list := []any{}
			for dec.More() {
				v, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				list = append(list, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return list, nil
		}
		return nil, fmt.Errorf("unexpected %v", t)
	}
	return tok, nil
}
