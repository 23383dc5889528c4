package worker

import (
	"errors"
	"reflect"
	"testing"

	"tandem/cluster"
	"tandem/llm"
)

// The batcher sends the first token alone, then n at a time, the last ones with the
// finish, and anything else after the tokens it holds: every token once, in order.
func TestTokenBatcher(t *testing.T) {
	var got [][]int32
	var kinds []cluster.EventKind
	b := &tokenBatcher{n: 3, send: func(ev *cluster.GenerateEvent) error {
		kinds = append(kinds, ev.Kind)
		switch ev.Kind {
		case cluster.EventToken:
			got = append(got, []int32{ev.Event.Token})
		case cluster.EventTokens:
			var ids []int32
			for _, e := range ev.Tokens {
				ids = append(ids, e.Token)
			}
			got = append(got, ids)
		default:
			got = append(got, nil)
		}
		return nil
	}}
	send := func(ev *cluster.GenerateEvent) {
		if err := b.sendEvent(ev); err != nil {
			t.Fatal(err)
		}
	}
	send(&cluster.GenerateEvent{Kind: cluster.EventAccepted})
	ge := &cluster.GenerateEvent{Kind: cluster.EventToken}
	for tok := int32(1); tok <= 9; tok++ {
		ge.Event = llm.Event{Token: tok} // the caller reuses its event
		if tok == 9 {
			ge.Event.Finish = llm.FinishLength
		}
		send(ge)
	}
	want := [][]int32{nil, {1}, {2, 3, 4}, {5, 6, 7}, {8, 9}}
	wantKinds := []cluster.EventKind{cluster.EventAccepted, cluster.EventToken, cluster.EventTokens, cluster.EventTokens, cluster.EventTokens}
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(kinds, wantKinds) {
		t.Errorf("sent %v (kinds %v), want %v (%v)", got, kinds, want, wantKinds)
	}

	// An error goes after the tokens held; a send that fails is returned.
	got, kinds = nil, nil
	b.sent = 0
	for tok := int32(1); tok <= 3; tok++ {
		send(&cluster.GenerateEvent{Kind: cluster.EventToken, Event: llm.Event{Token: tok}})
	}
	send(cluster.ErrorEvent(errors.New("boom")))
	if want := [][]int32{{1}, {2, 3}, nil}; !reflect.DeepEqual(got, want) || kinds[2] != cluster.EventError {
		t.Errorf("sent %v (kinds %v), want %v then the error", got, kinds, want)
	}
	fail := errors.New("gone")
	b.send = func(*cluster.GenerateEvent) error { return fail }
	if err := b.sendEvent(&cluster.GenerateEvent{Kind: cluster.EventToken, Event: llm.Event{Token: 1, Finish: llm.FinishStop}}); !errors.Is(err, fail) {
		t.Errorf("a failed send returned %v", err)
	}
}
