package openai

import (
	"encoding/json"
	"strings"
)

// The tool-call parser reads a choice's content as it streams and splits it into text
// and calls, as the model's format writes them:
//
//	hermes       text <tool_call>\n{"name": …, "arguments": {…}}\n</tool_call> … (Qwen2.5, Qwen3, Hermes)
//	llama3_json  {"name": …, "parameters": {…}}; {…} at the start of the output (Llama 3.x),
//	             after an optional <|python_tag|>
//	mistral      text [TOOL_CALLS][{"name": …, "arguments": {…}}, …], or
//	             [TOOL_CALLS]name[ARGS]{…} (newer templates); a bare list at the start
//	             when the calls are forced (the grammar cannot write the control token)
//
// A call's name is sent as soon as it is read and its arguments as they arrive, so that
// a stream carries OpenAI's tool_calls deltas. A call that does not parse ends as it is
// (streamed) or becomes text again (not streamed: toolEvent.raw).

type toolEventKind uint8

const (
	evText       toolEventKind = iota // content text
	evCallStart                       // a call with its name
	evCallArgs                        // more of the current call's arguments
	evCallEnd                         // the current call is complete
	evCallBroken                      // the current call did not parse; raw is its text
)

type toolEvent struct {
	kind toolEventKind
	text string // evText: the text; evCallStart: the name; evCallArgs: the arguments
	raw  string // evCallBroken: the call's text from its start
}

type parseState uint8

const (
	psStart       parseState = iota // nothing but whitespace yet
	psText                          // text, looking for a call's start
	psPlain                         // text to the end: no call can start any more
	psOpen                          // after a start marker: the call's first byte next
	psObject                        // inside a call's object
	psAfterObj                      // after a call's object: its end, a separator or more calls
	psMistralOpen                   // mistral: after [TOOL_CALLS], a list or a name next
	psMistralFn                     // mistral: a function name before [ARGS]
	psValue                         // mistral [ARGS]: the arguments value
)

// toolParser is one choice's parser.
type toolParser struct {
	f      *toolFormat
	forced bool // the grammar forced calls: a mistral bare list at the start is calls
	state  parseState
	buf    string // text received and not yet consumed
	list   bool   // inside a [ ... ] list of calls
	obj    objScanner
	val    valueScanner
	raw    strings.Builder // the current call's text, for a broken call
	calls  int
	// afterCall: text since the last call is whitespace so far, which is dropped if
	// another call or the end follows.
	afterCall bool
	name      string // mistral [ARGS] form: the name read
}

func newToolParser(f *toolFormat, forced bool) *toolParser {
	return &toolParser{f: f, forced: forced}
}

// feed takes more content text (all of it when final) and returns what it makes of it.
func (p *toolParser) feed(text string, final bool) []toolEvent {
	p.buf += text
	var out []toolEvent
	emitText := func(s string) {
		if s == "" {
			return
		}
		if n := len(out); n > 0 && out[n-1].kind == evText {
			out[n-1].text += s
			return
		}
		out = append(out, toolEvent{kind: evText, text: s})
	}
	for {
		progressed := true
		switch p.state {
		case psStart:
			trimmed := strings.TrimLeft(p.buf, " \t\r\n")
			if trimmed == "" {
				progressed = false
				break
			}
			switch {
			case p.f.name == "llama3_json" && strings.HasPrefix(trimmed, "<|python_tag|>"):
				p.buf = trimmed[len("<|python_tag|>"):]
				p.state = psOpen
			case p.f.name == "llama3_json" && strings.HasPrefix("<|python_tag|>", trimmed):
				progressed = false // could still be the tag
			case p.f.name == "llama3_json" && trimmed[0] == '{':
				p.buf = trimmed
				p.state = psOpen
			case p.f.name == "llama3_json":
				p.state = psPlain
			case p.f.name == "mistral" && p.forced && trimmed[0] == '[':
				p.buf = trimmed[1:]
				p.list = true
				p.raw.Reset()
				p.raw.WriteByte('[')
				p.state = psOpen
			default:
				p.state = psText
			}
		case psPlain:
			emitText(p.buf)
			p.buf = ""
			progressed = false
		case psText:
			i := strings.Index(p.buf, p.f.start)
			if i < 0 {
				keep := partialSuffix(p.buf, p.f.start)
				if rest := strings.TrimLeft(p.buf, " \t\r\n"); p.afterCall && strings.HasPrefix(p.f.start, rest) {
					keep = len(p.buf) // whitespace after a call: text only if text follows
				}
				if final {
					keep = 0
					if p.afterCall && strings.TrimLeft(p.buf, " \t\r\n") == "" {
						p.buf = ""
					}
				}
				if keep < len(p.buf) {
					p.afterCall = false
				}
				emitText(p.buf[:len(p.buf)-keep])
				p.buf = p.buf[len(p.buf)-keep:]
				progressed = false
				break
			}
			if !p.afterCall || strings.TrimLeft(p.buf[:i], " \t\r\n") != "" {
				emitText(p.buf[:i]) // whitespace between calls is not text
			}
			p.afterCall = false
			p.buf = p.buf[i+len(p.f.start):]
			p.raw.Reset()
			p.raw.WriteString(p.f.start)
			p.state = psOpen
			if p.f.name == "mistral" {
				p.state = psMistralOpen
			}
		case psMistralOpen:
			t := strings.TrimLeft(p.buf, " \t\r\n")
			switch {
			case t == "" && !final:
				progressed = false
			case t == "":
				out = append(out, p.broken(false))
			case t[0] == '[':
				p.raw.WriteString(p.buf[:len(p.buf)-len(t)+1])
				p.buf = t[1:]
				p.list = true
				p.state = psOpen
			default:
				p.state = psMistralFn
			}
		case psOpen:
			t := strings.TrimLeft(p.buf, " \t\r\n")
			if t == "" {
				if final {
					out = append(out, p.broken(false))
				}
				progressed = false
				break
			}
			if p.f.name == "mistral" && !p.list && p.state == psOpen && t[0] == '[' {
				p.raw.WriteString(p.buf[:len(p.buf)-len(t)+1])
				p.buf = t[1:]
				p.list = true
				break
			}
			if t[0] != '{' {
				out = append(out, p.broken(false))
				break
			}
			p.raw.WriteString(p.buf[:len(p.buf)-len(t)])
			p.buf = t
			p.obj = objScanner{argsKey: p.f.argsKey}
			p.state = psObject
		case psObject:
			n, evs := p.obj.scan(p.buf)
			p.raw.WriteString(p.buf[:n])
			p.buf = p.buf[n:]
			out = append(out, evs...)
			switch {
			case p.obj.broken:
				out = append(out, p.broken(p.obj.started))
			case p.obj.done:
				p.calls++
				out = append(out, toolEvent{kind: evCallEnd})
				p.state = psAfterObj
			default:
				if final {
					out = append(out, p.broken(p.obj.started))
				}
				progressed = false
			}
		case psAfterObj:
			t := strings.TrimLeft(p.buf, " \t\r\n")
			ws := p.buf[:len(p.buf)-len(t)]
			switch {
			case t == "" && !final:
				progressed = false
			case p.list && strings.HasPrefix(t, ","):
				p.buf = t[1:]
				p.raw.Reset()
				p.state = psOpen
			case p.list && strings.HasPrefix(t, "]"):
				p.buf = t[1:]
				p.list = false
				p.state, p.afterCall = p.textState(), true
			case p.list && t != "":
				p.list = false
				p.state = p.textState()
			case p.f.name == "hermes" && strings.HasPrefix(t, "</tool_call>"):
				p.buf = t[len("</tool_call>"):]
				p.state, p.afterCall = psText, true
			case p.f.name == "hermes" && strings.HasPrefix("</tool_call>", t) && !final:
				progressed = false
			case p.f.name == "llama3_json" && strings.HasPrefix(t, ";"):
				p.buf = t[1:]
				p.raw.Reset()
				p.state = psOpen
			case p.f.name == "llama3_json" && strings.HasPrefix(t, "{"):
				p.buf = t
				p.raw.Reset()
				p.state = psOpen
			default:
				p.buf = ws + t
				p.state = p.textState()
				if t == "" {
					p.buf = ""
					progressed = false
				}
			}
		case psMistralFn:
			i := strings.Index(p.buf, "[ARGS]")
			if i < 0 {
				if final || len(p.buf) > 256 {
					out = append(out, p.broken(false))
					break
				}
				progressed = false
				break
			}
			name := strings.TrimSpace(p.buf[:i])
			if !toolNameRE.MatchString(name) {
				out = append(out, p.broken(false))
				break
			}
			p.raw.WriteString(p.buf[:i+len("[ARGS]")])
			p.buf = p.buf[i+len("[ARGS]"):]
			out = append(out, toolEvent{kind: evCallStart, text: name})
			p.val = valueScanner{}
			p.state = psValue
		case psValue:
			n, args := p.val.scan(p.buf)
			p.raw.WriteString(p.buf[:n])
			p.buf = p.buf[n:]
			if args != "" {
				out = append(out, toolEvent{kind: evCallArgs, text: args})
			}
			switch {
			case p.val.broken:
				out = append(out, p.broken(true))
			case p.val.done:
				p.calls++
				out = append(out, toolEvent{kind: evCallEnd})
				p.state, p.afterCall = psText, true
			default:
				if final {
					out = append(out, p.broken(true))
				}
				progressed = false
			}
		}
		if !progressed {
			break
		}
	}
	if final && p.buf != "" {
		emitText(p.buf)
		p.buf = ""
	}
	return out
}

// textState is where text goes after the calls: llama3 recognises calls only at the
// start, the others look for another start marker.
func (p *toolParser) textState() parseState {
	if p.f.name == "llama3_json" || p.f.start == "" {
		return psPlain
	}
	return psText
}

// broken ends the current call as unparsed: its text (and what remains) goes on as text.
func (p *toolParser) broken(started bool) toolEvent {
	raw := p.raw.String()
	p.raw.Reset()
	p.list = false
	p.state = psPlain
	if !started {
		// Nothing of the call was sent: its text is text.
		p.buf = raw + p.buf
		return toolEvent{kind: evText}
	}
	return toolEvent{kind: evCallBroken, raw: raw}
}

// partialSuffix is the length of the longest suffix of s that is a proper prefix of m.
func partialSuffix(s, m string) int {
	for n := min(len(s), len(m)-1); n > 0; n-- {
		if strings.HasSuffix(s, m[:n]) {
			return n
		}
	}
	return 0
}

// objScanner reads one call object byte by byte: its "name", and its arguments, sent as
// they arrive once the name is known.
type objScanner struct {
	argsKey string
	phase   objPhase
	key     strings.Builder
	keyEsc  bool
	val     valueScanner
	field   string // the key whose value is being read
	name    strings.Builder
	hasName bool
	args    strings.Builder // arguments read before the name (sent with it)
	gotArgs bool
	started bool // the call's start was sent
	done    bool
	broken  bool
}

type objPhase uint8

const (
	opOpen     objPhase = iota // before '{'
	opKeyOrEnd                 // before a key or '}'
	opKey                      // inside a key
	opColon                    // before ':'
	opValue                    // inside a value
	opCommaEnd                 // before ',' or '}'
	opKeyNext                  // after ',': before a key
)

// scan reads from s and returns how many bytes it took and the events they make.
func (o *objScanner) scan(s string) (int, []toolEvent) {
	var out []toolEvent
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch o.phase {
		case opOpen:
			if c != '{' {
				o.broken = true
				return i, out
			}
			o.phase = opKeyOrEnd
		case opKeyOrEnd, opKeyNext:
			switch {
			case isSpace(c):
			case c == '"':
				o.key.Reset()
				o.phase = opKey
			case c == '}' && o.phase == opKeyOrEnd:
				return i + 1, append(out, o.finish()...)
			default:
				o.broken = true
				return i, out
			}
		case opKey:
			switch {
			case o.keyEsc:
				o.keyEsc = false
				o.key.WriteByte(c)
			case c == '\\':
				o.keyEsc = true
				o.key.WriteByte(c)
			case c == '"':
				var k string
				if json.Unmarshal([]byte(`"`+o.key.String()+`"`), &k) != nil {
					o.broken = true
					return i, out
				}
				o.field = k
				o.phase = opColon
			default:
				o.key.WriteByte(c)
			}
		case opColon:
			switch {
			case isSpace(c):
			case c == ':':
				o.val = valueScanner{}
				o.phase = opValue
			default:
				o.broken = true
				return i, out
			}
		case opValue:
			n, text := o.val.scan(s[i:])
			out = append(out, o.value(text)...)
			if o.val.broken {
				o.broken = true
				return i + n, out
			}
			if !o.val.done {
				return len(s), out
			}
			i += n - 1
			out = append(out, o.valueDone()...)
			o.phase = opCommaEnd
		case opCommaEnd:
			switch {
			case isSpace(c):
			case c == ',':
				o.phase = opKeyNext
			case c == '}':
				return i + 1, append(out, o.finish()...)
			default:
				o.broken = true
				return i, out
			}
		}
	}
	return len(s), out
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// isArgs reports whether the field being read is the arguments.
func (o *objScanner) isArgs() bool {
	return o.field == o.argsKey || o.field == "arguments" || o.field == "parameters"
}

// value takes more of the current value's text.
func (o *objScanner) value(text string) []toolEvent {
	switch {
	case o.field == "name":
		o.name.WriteString(text)
	case o.isArgs() && !o.gotArgs:
		if o.started && !o.val.isString {
			return []toolEvent{{kind: evCallArgs, text: text}}
		}
		o.args.WriteString(text)
	}
	return nil
}

// valueDone ends the current value: a name makes the call start (with any arguments
// read before it); arguments given as a JSON string are sent decoded.
func (o *objScanner) valueDone() []toolEvent {
	switch {
	case o.field == "name" && !o.hasName:
		var name string
		if json.Unmarshal([]byte(o.name.String()), &name) != nil || name == "" {
			o.broken = true
			return nil
		}
		o.hasName, o.started = true, true
		out := []toolEvent{{kind: evCallStart, text: name}}
		if o.args.Len() > 0 {
			out = append(out, toolEvent{kind: evCallArgs, text: o.decodeArgs(o.args.String())})
			o.args.Reset()
		}
		return out
	case o.isArgs() && !o.gotArgs:
		o.gotArgs = true
		if o.started && o.val.isString {
			return []toolEvent{{kind: evCallArgs, text: o.decodeArgs(o.args.String())}}
		}
	}
	return nil
}

// decodeArgs returns arguments as OpenAI sends them: the JSON text of the value, or a
// string's content when the model wrote the arguments as a JSON string.
func (o *objScanner) decodeArgs(raw string) string {
	if o.val.isString || strings.HasPrefix(strings.TrimSpace(raw), `"`) {
		var s string
		if json.Unmarshal([]byte(raw), &s) == nil {
			return s
		}
	}
	return raw
}

// finish ends the object: a call without a name did not parse; one without arguments
// has {}.
func (o *objScanner) finish() []toolEvent {
	if !o.hasName {
		o.broken = true
		return nil
	}
	o.done = true
	if !o.gotArgs {
		return []toolEvent{{kind: evCallArgs, text: "{}"}}
	}
	return nil
}

// valueScanner reads one JSON value byte by byte and finds its end.
type valueScanner struct {
	begun    bool
	isString bool
	scalar   bool
	depth    int
	inStr    bool
	esc      bool
	done     bool
	broken   bool
}

// scan reads from s and returns how many bytes it took and the value's text among them
// (leading whitespace left out). A scalar ends at the byte after it, which it does not
// take.
func (v *valueScanner) scan(s string) (int, string) {
	if v.begun {
		n := v.scanBody(s)
		return n, s[:n]
	}
	i := 0
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	if i == len(s) {
		return i, ""
	}
	switch c := s[i]; {
	case c == '{' || c == '[':
		v.depth = 1
	case c == '"':
		v.isString, v.inStr = true, true
	case c == '-' || c >= '0' && c <= '9' || c == 't' || c == 'f' || c == 'n':
		v.scalar = true
	default:
		v.broken = true
		return i, ""
	}
	v.begun = true
	start := i
	i++
	n := v.scanBody(s[i:])
	return i + n, s[start : i+n]
}

// scanBody continues a begun value and returns how many bytes of s belong to it.
func (v *valueScanner) scanBody(s string) int {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case v.inStr:
			switch {
			case v.esc:
				v.esc = false
			case c == '\\':
				v.esc = true
			case c == '"':
				v.inStr = false
				if v.isString {
					v.done = true
					return i + 1
				}
			}
		case v.scalar:
			if isSpace(c) || c == ',' || c == '}' || c == ']' {
				v.done = true
				return i
			}
		case c == '"':
			v.inStr = true
		case c == '{' || c == '[':
			v.depth++
		case c == '}' || c == ']':
			v.depth--
			if v.depth == 0 {
				v.done = true
				return i + 1
			}
		}
	}
	return len(s)
}
