package openai

import (
	"bytes"
	"math"
)

// A prompt of token ids is most of a long request's body: 60k ids are ~400 KB of JSON,
// which encoding/json scans several times over and decodes through reflection at a cost
// that dominated the router's CPU. The functions here read such a body once, by hand, for
// the one way clients write it (plain decimal integers); anything else goes the
// encoding/json way, which gives the same answer or the error.

// isJSONSpace reports whether c is whitespace between JSON tokens.
func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// skipSpace returns the index of the first non-space byte of b at or after i.
func skipSpace(b []byte, i int) int {
	for i < len(b) && isJSONSpace(b[i]) {
		i++
	}
	return i
}

// scanTokenIDs decodes the JSON array of token ids at the start of b (after optional
// whitespace) and returns the ids and the index just past the array's ']'. It accepts
// only a non-empty array of unsigned decimal integers up to math.MaxInt32 without leading
// zeros, fractions or exponents, the bytes encoding/json decodes to the same []int64; for
// anything else (other values, an empty array, invalid JSON) ok is false and the caller
// must decode b with encoding/json.
func scanTokenIDs(b []byte) (ids []int32, end int, ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, 0, false
	}
	i = skipSpace(b, i+1)
	if i >= len(b) || b[i] < '0' || b[i] > '9' {
		return nil, 0, false // empty, or not a plain integer first
	}
	// Every id but the last is followed by a comma: size the slice once. The count runs
	// to the end of b, past the array when b holds more; that only over-sizes.
	ids = make([]int32, 0, bytes.Count(b[i:], []byte{','})+1)
	for {
		// An id: at most 10 digits (math.MaxInt32 has 10), the first not a 0 unless alone.
		start := i
		var v uint64
		for i < len(b) {
			d := b[i] - '0'
			if d > 9 {
				break
			}
			v = v*10 + uint64(d)
			i++
		}
		if n := i - start; n == 0 || n > 10 || v > math.MaxInt32 || b[start] == '0' && n > 1 {
			return nil, 0, false // none, too large, or a leading zero (not JSON)
		}
		ids = append(ids, int32(v))
		if i < len(b) && b[i] == ',' { // the common case: no spaces around the comma
			i++
			continue
		}
		i = skipSpace(b, i)
		if i >= len(b) {
			return nil, 0, false
		}
		switch b[i] {
		case ',':
			i = skipSpace(b, i+1)
		case ']':
			return ids, i + 1, true
		default:
			return nil, 0, false // a fraction, an exponent, another value, or not JSON
		}
	}
}

// skipString returns the index just past the JSON string that starts at b[i] ('"'),
// or -1 when it does not end. It does not validate the string: the caller's decoding does.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}

// skipValue returns the index just past the JSON value that starts at b[i], or -1. Like
// skipString it finds the value's end without validating it.
func skipValue(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				if i = skipString(b, i); i < 0 {
					return -1
				}
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return -1
	}
	for i < len(b) && !isJSONSpace(b[i]) && b[i] != ',' && b[i] != '}' && b[i] != ']' {
		i++
	}
	return i
}

// cutPromptIDs finds the top-level "prompt" member of a request body whose value is an
// array of token ids scanTokenIDs reads, and returns the ids and a copy of the body with
// that value replaced by [], for encoding/json to decode the other fields without
// scanning the ids. ok is false, and the body must be decoded as it is, when the body is
// not an object, has no such member, has another key that encoding/json would also match
// to the prompt field (any case, or escaped), or is not JSON as far as the scan sees.
// The caller decodes the copy, and decodes the body itself again if the copy fails, so
// that errors are reported as they always were.
func cutPromptIDs(body []byte) (ids []int32, rest []byte, ok bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil, nil, false
	}
	i = skipSpace(body, i+1)
	vstart, vend := -1, -1
	for i < len(body) && body[i] != '}' {
		if body[i] != '"' {
			return nil, nil, false
		}
		kend := skipString(body, i)
		if kend < 0 {
			return nil, nil, false
		}
		key := body[i+1 : kend-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return nil, nil, false // an escaped key could spell "prompt"
		}
		i = skipSpace(body, kend)
		if i >= len(body) || body[i] != ':' {
			return nil, nil, false
		}
		i = skipSpace(body, i+1)
		switch {
		case string(key) == "prompt" && vstart < 0:
			p, n, found := scanTokenIDs(body[i:])
			if !found {
				return nil, nil, false
			}
			ids, vstart, vend = p, i, i+n
			i = vend
		case bytes.EqualFold(key, []byte("prompt")):
			return nil, nil, false // a second prompt field: encoding/json's rules decide
		default:
			if i = skipValue(body, i); i < 0 {
				return nil, nil, false
			}
		}
		i = skipSpace(body, i)
		if i < len(body) && body[i] == ',' {
			i = skipSpace(body, i+1)
		}
	}
	if vstart < 0 || i >= len(body) || skipSpace(body, i+1) != len(body) {
		return nil, nil, false
	}
	rest = make([]byte, 0, len(body)-(vend-vstart)+2)
	rest = append(rest, body[:vstart]...)
	rest = append(rest, "[]"...)
	rest = append(rest, body[vend:]...)
	return ids, rest, true
}
