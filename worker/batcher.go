package worker

import "tandem/cluster"

// tokenBatcher sends a Generate stream's tokens n to a message (an EventTokens event) for
// a router that asked for it (GenerateRequest.StreamInterval): the first token alone, at
// once, as it sets the time to first token; then n at a time, and the last ones with the
// finish. Any other event goes after the tokens held.
type tokenBatcher struct {
	send  func(*cluster.GenerateEvent) error
	n     int
	sent  int // tokens taken so far
	batch cluster.GenerateEvent
}

func (b *tokenBatcher) sendEvent(ev *cluster.GenerateEvent) error {
	if ev.Kind != cluster.EventToken {
		if err := b.flush(); err != nil {
			return err
		}
		return b.send(ev)
	}
	b.batch.Tokens = append(b.batch.Tokens, ev.Event)
	b.sent++
	if b.sent == 1 || len(b.batch.Tokens) >= b.n || ev.Event.Finish != "" {
		return b.flush()
	}
	return nil
}

// flush sends the tokens held: one as a plain token event, several as EventTokens.
func (b *tokenBatcher) flush() error {
	var err error
	switch len(b.batch.Tokens) {
	case 0:
		return nil
	case 1:
		err = b.send(&cluster.GenerateEvent{Kind: cluster.EventToken, Event: b.batch.Tokens[0]})
	default:
		b.batch.Kind = cluster.EventTokens
		err = b.send(&b.batch)
	}
	clear(b.batch.Tokens)
	b.batch.Tokens = b.batch.Tokens[:0]
	return err
}
