package engine

import (
	"slices"

	"tandem/llm"
	"tandem/tokenizer"
)

// stopRules decide when a generation ends; the scheduler and the
// single-sequence generator share them. A stop token id, or an
// end-of-generation token unless ignoreEOS, ends it with "stop"; the
// maxTokens-th generated token with "length".
type stopRules struct {
	tok        *tokenizer.Tokenizer
	stopTokens []int32
	ignoreEOS  bool
	maxTokens  int // already capped by the context length (see maxNewTokens)
}

// finish returns why generation ends after token id, the generated-th
// token, or "" when it goes on.
func (r *stopRules) finish(id int32, generated int) llm.FinishReason {
	switch {
	case slices.Contains(r.stopTokens, id) || (!r.ignoreEOS && r.tok.IsEOG(id)):
		return llm.FinishStop
	case generated >= r.maxTokens:
		return llm.FinishLength
	}
	return ""
}

// maxNewTokens is how many tokens a prompt of promptLen may be followed by:
// requested (0: no limit), capped so that the sequence fits the context.
func maxNewTokens(contextLen, promptLen, requested int) int {
	n := contextLen - promptLen
	if requested > 0 && requested < n {
		n = requested
	}
	return n
}
