package openai

import (
	"strings"

	"tandem/grammar"
)

// Reasoning: models whose chat template thinks (Qwen3, DeepSeek-R1 and their kin) write
// their reasoning in a <think>…</think> block before the answer. The block is returned
// apart, as reasoning_content and reasoning (servers disagree on the name; clients read
// either), streamed as it comes.

const (
	thinkStart = "<think>"
	thinkEnd   = "</think>"
)

// templateThinks reports whether a chat template writes think blocks (or strips them
// from the history, as DeepSeek-R1's does).
func templateThinks(template string) bool {
	return strings.Contains(template, thinkStart) || strings.Contains(template, thinkEnd)
}

// promptOpensThinking reports whether a rendered prompt ends inside a think block (the
// template opened it for the model, as DeepSeek-R1's does): the output then begins
// with reasoning and has no <think> of its own.
func promptOpensThinking(prompt string) bool {
	return strings.LastIndex(prompt, thinkStart) > strings.LastIndex(prompt, thinkEnd)
}

// promptClosesThinking reports whether a rendered prompt ends with a closed think block
// (the template turned thinking off, as Qwen3's does for enable_thinking false): the
// output is the answer alone.
func promptClosesThinking(prompt string) bool {
	return strings.HasSuffix(strings.TrimRight(prompt, " \t\r\n"), thinkEnd)
}

// reasoningSplitter splits a choice's text into reasoning and content as it streams.
// The reasoning is trimmed of the whitespace at its ends, and the content of the
// whitespace that follows </think>.
type reasoningSplitter struct {
	state reasonState
	buf   string // text held back: a marker's beginning, or trailing whitespace
	began bool   // reasoning text other than leading whitespace has come
}

type reasonState uint8

const (
	rsStart     reasonState = iota // the output may begin with <think>
	rsReasoning                    // inside the block
	rsAfter                        // after </think>: whitespace is dropped until text
	rsContent
)

func newReasoningSplitter(inside bool) *reasoningSplitter {
	r := &reasoningSplitter{}
	if inside {
		r.state = rsReasoning
	}
	return r
}

// feed takes more text (all of it when final) and returns the reasoning and content
// that are now final.
func (r *reasoningSplitter) feed(text string, final bool) (reasoning, content string) {
	r.buf += text
	var rs, cs strings.Builder
	for {
		switch r.state {
		case rsStart:
			t := strings.TrimLeft(r.buf, " \t\r\n")
			switch {
			case strings.HasPrefix(t, thinkStart):
				r.buf = t[len(thinkStart):]
				r.state = rsReasoning
				continue
			case (t == "" || strings.HasPrefix(thinkStart, t)) && !final:
				return rs.String(), cs.String()
			}
			r.state = rsContent
			continue
		case rsReasoning:
			if !r.began {
				r.buf = strings.TrimLeft(r.buf, " \t\r\n")
				if r.buf == "" {
					return rs.String(), cs.String()
				}
				r.began = true
			}
			i := strings.Index(r.buf, thinkEnd)
			if i >= 0 {
				rs.WriteString(strings.TrimRight(r.buf[:i], " \t\r\n"))
				r.buf = r.buf[i+len(thinkEnd):]
				r.state = rsAfter
				continue
			}
			keep := partialSuffix(r.buf, thinkEnd)
			body := r.buf[:len(r.buf)-keep]
			trimmed := strings.TrimRight(body, " \t\r\n")
			if final {
				rs.WriteString(strings.TrimRight(r.buf, " \t\r\n"))
				r.buf = ""
				return rs.String(), cs.String()
			}
			// Trailing whitespace waits: it is dropped if </think> follows.
			rs.WriteString(trimmed)
			r.buf = body[len(trimmed):] + r.buf[len(body):]
			return rs.String(), cs.String()
		case rsAfter:
			t := strings.TrimLeft(r.buf, " \t\r\n")
			r.buf = t
			if t == "" {
				return rs.String(), cs.String()
			}
			r.state = rsContent
			continue
		case rsContent:
			cs.WriteString(r.buf)
			r.buf = ""
			return rs.String(), cs.String()
		}
	}
}

// thinkPrefix adds to b the grammar of the reasoning before a constrained answer: the
// rest of an open block (inside), or an optional block, then a little whitespace.
func thinkPrefix(b *grammar.Builder, inside bool) grammar.Expr {
	ws := grammar.Repeat(grammar.Class(false, ' ', ' ', '\n', '\n'), 0, 4)
	if inside {
		return grammar.Seq(b.TextThrough(thinkEnd), ws)
	}
	return grammar.Opt(grammar.Seq(grammar.Lit(thinkStart), b.TextThrough(thinkEnd), ws))
}
