package cluster

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"tandem/kvcache"
	"tandem/llm"
	"tandem/orpc"
)

func roundTrip[T any, P interface {
	*T
	orpc.Message
}](t *testing.T, in P) P {
	t.Helper()
	b := orpc.Marshal(in)
	out := P(new(T))
	if err := orpc.Unmarshal(b, out); err != nil {
		t.Fatalf("%T: %v", in, err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("%T round trip:\n got %+v\nwant %+v", in, out, in)
	}
	// Every truncation fails cleanly, never panics.
	for i := range b {
		_ = orpc.Unmarshal(b[:i], P(new(T)))
	}
	return out
}

func TestRoundTrip(t *testing.T) {
	roundTrip(t, &ModelCard{Version: Version, Model: "m", Node: "n-1", Addr: "127.0.0.1:7", Role: RoleBoth, HashVersion: 1,
		BlockSize: 16, Salt: 0x7d38246f2d3ef01c, KVBlocks: 512, ContextLen: 4096, TokenizerFormat: TokenizerHF,
		TokenizerFiles: []File{{Name: "tokenizer.json", Data: []byte("{}")}}, ChatTemplate: "{{x}}",
		GrammarFormat: GrammarGBNF, ToolCallParser: "hermes", ReasoningParser: "none", RequestLevel: RequestTokens, Pooling: "mean"})
	roundTrip(t, &RegisterReply{WorkerID: 3, HeartbeatMs: 250, Router: "r", DispatchKey: 0x1234567890abcdef, HeartbeatTimeoutMs: 1000, BeatMs: 2000})
	roundTrip(t, &LoadReport{WorkerID: 1, Load: llm.Load{Running: 2, Waiting: 3, PrefillTokens: 4, DecodeBlocks: 5, KVUsage: 0.5,
		KVBlocks: 6, LastEventID: 7, Healthy: true, StepMicros: 8, StepTokens: 9, Received: 10, Tracked: true,
		Queued: 11, QueuedTokens: 12, CachedBlocks: 13, StepsOverTarget: 20, Onboarding: 14, TierLoadMicros: [4]int{0, 15, 16, 17},
		BlockPrefillMicros: 18, PullMicros: 19, Adapters: "a@0123456789abcdef b@fedcba9876543210", Step: 1 << 40}})
	roundTrip(t, &KVEvents{WorkerID: 2, Events: []kvcache.Event{
		{ID: 1, Kind: kvcache.EventStored, Parent: 0, Hashes: []uint64{1, 2}},
		{ID: 2, Kind: kvcache.EventRemoved, Tier: kvcache.TierHost, Hashes: []uint64{2}},
		{ID: 3, Kind: kvcache.EventCleared}}})
	roundTrip(t, &Snapshot{kvcache.Snapshot{LastID: 9, Blocks: []kvcache.CachedBlock{{Hash: 5, Parent: 0}, {Hash: 6, Parent: 5}}}})
	roundTrip(t, &Snapshot{kvcache.Snapshot{LastID: 9, Blocks: []kvcache.CachedBlock{{Hash: 5, Parent: 0}},
		Lower: []kvcache.TierSnapshot{{Tier: kvcache.TierHost, Blocks: []kvcache.CachedBlock{{Hash: 6, Parent: 5}}}, {Tier: kvcache.TierDisk, Blocks: []kvcache.CachedBlock{}}}}})
	roundTrip(t, &GenerateRequest{Request: llm.Request{ID: "r", Model: "m", Prompt: []int32{1, 2, 3}, MaxTokens: 5,
		StopTokens: []int32{9}, IgnoreEOS: true, Priority: -1, Arrival: time.Unix(0, 12345),
		Sampling: llm.SamplingParams{Temperature: 0.5, TopK: 4, TopP: 0.9, MinP: 0.1, RepetitionPenalty: 1.1,
			PresencePenalty: 0.2, FrequencyPenalty: -0.2, LogitBias: map[int32]float32{3: 1, 7: -2}, Seed: 42,
			HasSeed: true, TopLogprobs: 2, Logprobs: true, MinTokens: 3, AllowedTokens: []int32{1, 5}},
		Constraint: llm.Constraint{Grammar: `root ::= "a"`}, PromptLogprobs: true, PromptTopLogprobs: 4, Pooling: llm.PoolMean,
		Adapter: "sql-lora", NoSpeculation: true}, PredictedCached: 16,
		Peer: KVPeer{Addr: "127.0.0.1:7", Node: "w2", Blocks: 40, TimeoutMs: 3000}})
	roundTrip(t, &GenerateEvent{Kind: EventToken, Event: llm.Event{Token: 7, Logprob: -0.5,
		Top: []llm.TokenLogprob{{ID: 7, Logprob: -0.5}}, Finish: llm.FinishLength,
		Usage: llm.Usage{PromptTokens: 3, CachedTokens: 1, CompletionTokens: 5}, Step: 99}})
	roundTrip(t, &GenerateEvent{Kind: EventToken, Event: llm.Event{Token: 7, PromptLogprobs: []llm.PromptLogprob{
		{Logprob: -1, Rank: 2, Top: []llm.TokenLogprob{{ID: 3, Logprob: -0.1}}}, {Logprob: -2, Rank: 1}}}})
	roundTrip(t, &GenerateEvent{Kind: EventToken, Event: llm.Event{Token: -1, Finish: llm.FinishStop, Embedding: []float32{0.5, -1, 2}}})
}

// peerTail is the bytes of a request's empty peer fields (two empty strings, two zeros).
const peerTail = 4

// The peer is a trailing field: a request from a router that predates it decodes with
// none.
func TestPeerWireCompatibility(t *testing.T) {
	req := &GenerateRequest{Request: llm.Request{ID: "r", Prompt: []int32{1}, Pooling: llm.PoolMean}, Peer: KVPeer{Addr: "a:1", Node: "n", Blocks: 3, TimeoutMs: 9}}
	b := orpc.Marshal(req)
	tail := len(orpc.Marshal(&GenerateRequest{Request: req.Request})) - peerTail - 2 // the RequestAdapters fields follow
	var old GenerateRequest
	if err := orpc.Unmarshal(b[:tail], &old); err != nil || old.Peer != (KVPeer{}) || old.Pooling != llm.PoolMean {
		t.Errorf("request without the peer: %+v, %v", old, err)
	}
}

// The lower tiers' fields are trailing: a load report or snapshot from a worker that
// predates them decodes with none, and an older router reads what it knew.
func TestTierFieldsWireCompatibility(t *testing.T) {
	lr := &LoadReport{WorkerID: 1, Load: llm.Load{Running: 2, CachedBlocks: 13, Onboarding: 4, TierLoadMicros: [4]int{0, 100, 2000, 3000},
		BlockPrefillMicros: 900000, PullMicros: 500}}
	b := orpc.Marshal(lr)
	tail := 1 + 1 + 2 + 2 + 3 + 2 + 1 + 1 // the uvarints of the six new fields, and the empty adapter list and step after them
	var old LoadReport
	if err := orpc.Unmarshal(b[:len(b)-tail], &old); err != nil || old.CachedBlocks != 13 || old.Onboarding != 0 || old.TierLoadMicros != [4]int{} {
		t.Errorf("report without the tier fields: %+v, %v", old, err)
	}
	snap := &Snapshot{kvcache.Snapshot{LastID: 3, Blocks: []kvcache.CachedBlock{{Hash: 5}}}}
	b = orpc.Marshal(snap)
	var s Snapshot
	if err := orpc.Unmarshal(b[:len(b)-1], &s); err != nil || len(s.Blocks) != 1 || s.Lower != nil {
		t.Errorf("snapshot without the lower tiers: %+v, %v", s, err)
	}
}

// The RequestTokens fields are trailing: a request or card from a process that predates
// them decodes with none, a token event without them stays as short as before, and an
// old reader skips the new event fields.
func TestRequestTokensWireCompatibility(t *testing.T) {
	req := &GenerateRequest{Request: llm.Request{ID: "r", Prompt: []int32{1}, Constraint: llm.Constraint{Grammar: "root ::= \"x\""}}}
	b := orpc.Marshal(req)
	var got GenerateRequest
	if err := orpc.Unmarshal(b[:len(b)-2-peerTail-5], &got); err != nil || got.Constraint != req.Constraint || got.Sampling.MinTokens != 0 { // the peer and RequestAdapters fields follow
		t.Errorf("request without the RequestTokens fields: %+v, %v", got, err)
	}
	card := orpc.Marshal(&ModelCard{Version: Version, Model: "m", GrammarFormat: GrammarGBNF})
	var c ModelCard
	// The weights fields (content hash, prepared key, start-up: 4 bytes empty) and the
	// pipeline stages and the KV format (1 byte each, empty) follow.
	if err := orpc.Unmarshal(card[:len(card)-1-1-4-2], &c); err != nil || c.RequestLevel != 0 || c.GrammarFormat != GrammarGBNF {
		t.Errorf("card without the request level: %+v, %v", c, err)
	}
	plain := orpc.Marshal(&GenerateEvent{Kind: EventToken, Event: llm.Event{Token: 5}})
	full := orpc.Marshal(&GenerateEvent{Kind: EventToken, Event: llm.Event{Token: 5, Embedding: []float32{1}}})
	if len(full) <= len(plain) || string(full[:len(plain)]) != string(plain) {
		t.Errorf("the event's new fields are not a trailing addition: %x, %x", plain, full)
	}
}

// The RequestAdapters fields are trailing: a request or load report from a process that
// predates them decodes with no adapter.
func TestRequestAdaptersWireCompatibility(t *testing.T) {
	req := &GenerateRequest{Request: llm.Request{ID: "r", Prompt: []int32{1}, Adapter: "a", NoSpeculation: true, Pooling: llm.PoolLast}}
	b := orpc.Marshal(req)
	var got GenerateRequest
	if err := orpc.Unmarshal(b[:len(b)-3], &got); err != nil || got.Adapter != "" || got.NoSpeculation || got.Pooling != llm.PoolLast {
		t.Errorf("request without the RequestAdapters fields: %+v, %v", got, err)
	}
	rep := orpc.Marshal(&LoadReport{WorkerID: 1, Load: llm.Load{CachedBlocks: 3, Adapters: "a@1"}})
	var r LoadReport
	if err := orpc.Unmarshal(rep[:len(rep)-5], &r); err != nil || r.Adapters != "" || r.CachedBlocks != 3 { // the step follows
		t.Errorf("load report without the adapters: %+v, %v", r, err)
	}
	l := llm.Load{Adapters: llm.AdapterList([]llm.AdapterInfo{{Name: "a", ID: "11"}, {Name: "bb", ID: "22"}})}
	for _, tc := range []struct {
		name, id string
		ok       bool
	}{{"a", "11", true}, {"bb", "22", true}, {"b", "", false}, {"", "", false}} {
		if id, ok := l.Adapter(tc.name); id != tc.id || ok != tc.ok {
			t.Errorf("Adapter(%q) in %q: %q %v", tc.name, l.Adapters, id, ok)
		}
	}
}

func TestErrorEvents(t *testing.T) {
	for _, base := range []error{llm.ErrInvalid, llm.ErrPromptTooLong, llm.ErrQueueFull, llm.ErrUnavailable} {
		ev := roundTrip(t, ErrorEvent(errors.Join(base, errors.New("detail"))))
		if err := ev.Error(); !errors.Is(err, base) {
			t.Errorf("%v: got %v", base, err)
		}
	}
	if err := ErrorEvent(errors.New("boom")).Error(); err == nil || errors.Is(err, llm.ErrUnavailable) {
		t.Errorf("other error: %v", err)
	}
}

// A report from a worker that predates a trailing field decodes with the field zero: one
// without the step, one without the adapters too, one without the lower tiers' fields too,
// one without the steps over the ITL target too, one without the queued prompts and the
// cache size too, and one without the dispatch number too.
func TestLoadReportFromOlderWorkers(t *testing.T) {
	now := LoadReport{WorkerID: 1, Load: llm.Load{Running: 2, Waiting: 3, PrefillTokens: 4, DecodeBlocks: 5, KVUsage: 0.5,
		KVBlocks: 6, LastEventID: 7, Healthy: true, StepMicros: 8, StepTokens: 9, Received: 10, Tracked: true,
		Queued: 11, QueuedTokens: 12, CachedBlocks: 13, StepsOverTarget: 14, Step: 15}}
	// The last byte is the step; the one before it the empty adapter list; the six before
	// it the lower tiers' zero fields; the one before them StepsOverTarget; the three
	// before it one byte each, as Received and Tracked.
	b := orpc.Marshal(&now)
	noStep := now
	noStep.Step = 0
	noSteps := noStep
	noSteps.StepsOverTarget = 0
	noQueue := noSteps
	noQueue.Queued, noQueue.QueuedTokens, noQueue.CachedBlocks = 0, 0, 0
	older := noQueue
	older.Received, older.Tracked = 0, false
	for _, c := range []struct {
		drop int
		want LoadReport
	}{{0, now}, {1, noStep}, {2, noStep}, {8, noStep}, {9, noSteps}, {12, noQueue}, {14, older}} {
		var got LoadReport
		if err := orpc.Unmarshal(b[:len(b)-c.drop], &got); err != nil || got != c.want {
			t.Errorf("without the last %d bytes: %+v (%v), want %+v", c.drop, got, err, c.want)
		}
	}
}

// The step is the event tail's last field: a token event without one stays as short as
// before, an event with one reads as it was sent, one from a worker that predates it (the
// tail ends after the embedding) reads with step 0, and a router that predates it reads
// the rest and ignores it, alone or inside a kind-3 message.
func TestEventStepWireCompatibility(t *testing.T) {
	plain := orpc.Marshal(&GenerateEvent{Kind: EventToken, Event: llm.Event{Token: 5}})
	stepped := orpc.Marshal(&GenerateEvent{Kind: EventToken, Event: llm.Event{Token: 5, Step: 300}})
	if len(stepped) != len(plain)+1+1+2 || string(stepped[:len(plain)]) != string(plain) {
		t.Errorf("the step is not a trailing addition: %x, %x", plain, stepped)
	}
	var got GenerateEvent
	if err := orpc.Unmarshal(stepped[:len(stepped)-2], &got); err != nil || got.Event.Step != 0 || got.Event.Token != 5 || got.Event.Embedding != nil {
		t.Errorf("event from an older worker: %+v, %v", got, err)
	}
	// What an older router reads: the fields up to the embedding (the step's byte left
	// unread, as a decoder leaves trailing bytes).
	full := &GenerateEvent{Kind: EventToken, Event: llm.Event{Token: -1, Finish: llm.FinishStop, Embedding: []float32{1, 2}, Step: 7}}
	b := orpc.Marshal(full)
	if err := orpc.Unmarshal(b[:len(b)-1], &got); err != nil || got.Event.Step != 0 || got.Event.Finish != llm.FinishStop || len(got.Event.Embedding) != 2 {
		t.Errorf("event read without its step: %+v, %v", got, err)
	}
	batch := &GenerateEvent{Kind: EventTokens, Tokens: []llm.Event{{Token: 1}, {Token: 2, Finish: llm.FinishLength, Step: 9}}}
	if err := orpc.Unmarshal(orpc.Marshal(batch), &got); err != nil || len(got.Tokens) != 2 || got.Tokens[0].Step != 0 || got.Tokens[1].Step != 9 {
		t.Errorf("tokens with a step on the last: %+v, %v", got, err)
	}
}

// The constraint is a trailing field: a request from a router that predates it decodes
// with none, and a card from a worker that predates it says the worker follows none.
func TestConstraintWireCompatibility(t *testing.T) {
	req := &GenerateRequest{Request: llm.Request{ID: "r", Prompt: []int32{1}, Resumed: 0}, DispatchSeq: 3}
	b := orpc.Marshal(req)
	old := b[:len(b)-2-peerTail-2-5] // the RequestAdapters fields; the peer; uvarint format 0, empty string; the RequestTokens fields
	var got GenerateRequest
	if err := orpc.Unmarshal(old, &got); err != nil || !got.Constraint.IsZero() || got.DispatchSeq != 3 {
		t.Errorf("request without the constraint field: %+v, %v", got, err)
	}
	req.Constraint.Grammar = "root ::= \"x\""
	got = GenerateRequest{}
	if err := orpc.Unmarshal(orpc.Marshal(req), &got); err != nil || got.Constraint != req.Constraint {
		t.Errorf("constraint did not survive: %+v, %v", got.Constraint, err)
	}
	// A format this worker does not know is refused, not ignored.
	e := orpc.Marshal(&GenerateRequest{Request: llm.Request{ID: "r"}})
	e = append(e[:len(e)-2-peerTail-2-5], 9, 1, 'x')
	if err := orpc.Unmarshal(e, new(GenerateRequest)); err == nil {
		t.Error("an unknown constraint format decoded")
	}
	card := orpc.Marshal(&ModelCard{Version: Version, Model: "m"})
	var c ModelCard
	if err := orpc.Unmarshal(card[:len(card)-2-1-1-4-2-3], &c); err != nil || c.GrammarFormat != 0 {
		t.Errorf("card without the grammar field: %+v, %v", c, err)
	}
}

// Several tokens in one message: each as its own event would carry it, in order; an
// interval of 1 or none leaves a request's bytes as they were, and an old worker reads
// the request without it.
func TestStreamIntervalWire(t *testing.T) {
	roundTrip(t, &GenerateEvent{Kind: EventTokens, Tokens: []llm.Event{
		{Token: 7, Logprob: -0.5, Top: []llm.TokenLogprob{{ID: 7, Logprob: -0.5}, {ID: 3, Logprob: -2}}},
		{Token: 8},
		{Token: -3, Logprob: -1, Finish: llm.FinishLength, Usage: llm.Usage{PromptTokens: 3, CachedTokens: 1, CompletionTokens: 5}},
	}})
	// A nested event longer than 127 bytes takes a two-byte length.
	long := llm.Event{Token: 1, Top: make([]llm.TokenLogprob, 40)}
	for i := range long.Top {
		long.Top[i] = llm.TokenLogprob{ID: int32(i * 1000), Logprob: float32(-i)}
	}
	roundTrip(t, &GenerateEvent{Kind: EventTokens, Tokens: []llm.Event{{Token: 5}, long, {Token: 6}}})

	var g GenerateEvent
	if err := orpc.Unmarshal(orpc.Marshal(&GenerateEvent{Kind: EventTokens, Tokens: []llm.Event{{Token: 1}, {Token: 2}}}), &g); err != nil {
		t.Fatal(err)
	}
	if err := orpc.Unmarshal(orpc.Marshal(&GenerateEvent{Kind: EventToken, Event: llm.Event{Token: 9}}), &g); err != nil || len(g.Tokens) != 0 || g.Event.Token != 9 {
		t.Errorf("a token event after a batch decodes as %+v, %v", g, err)
	}
	bad := orpc.Marshal(&GenerateEvent{Kind: EventTokens, Tokens: []llm.Event{{Token: 1}}})
	bad[3] = byte(EventError) // the nested event's kind
	if err := orpc.Unmarshal(bad, &g); err == nil {
		t.Error("an error event among tokens decoded")
	}

	req := &GenerateRequest{Request: llm.Request{ID: "r", Prompt: []int32{1}, Adapter: "a"}}
	plain := orpc.Marshal(req)
	req.StreamInterval = 1
	if b := orpc.Marshal(req); string(b) != string(plain) {
		t.Error("an interval of 1 changed the request's bytes")
	}
	req.StreamInterval = 16
	b := orpc.Marshal(req)
	got := roundTrip(t, req)
	if got.StreamInterval != 16 || string(b[:len(plain)]) != string(plain) {
		t.Errorf("the interval is not a trailing field: %+v", got)
	}
	var old GenerateRequest
	if err := orpc.Unmarshal(plain, &old); err != nil || old.StreamInterval != 0 || old.Adapter != "a" {
		t.Errorf("request without the interval: %+v, %v", old, err)
	}
}

// The beat period is a trailing field: a reply from a router that predates it decodes with
// none (the worker then probes with Router.Heartbeat calls), and an older worker's decoder,
// which stops at the heartbeat timeout, reads a reply of this version as before.
func TestRegisterReplyBeatWire(t *testing.T) {
	r := &RegisterReply{WorkerID: 3, HeartbeatMs: 250, Router: "r", DispatchKey: 9, HeartbeatTimeoutMs: 2000, BeatMs: 2000}
	b := orpc.Marshal(r)
	var old RegisterReply
	if err := orpc.Unmarshal(b[:len(b)-2], &old); err != nil || old.BeatMs != 0 || old.HeartbeatTimeoutMs != 2000 {
		t.Errorf("reply without the beat: %+v, %v", old, err)
	}
	d := orpc.NewDecoder(b)
	if d.Uvarint() != 3 || d.Uvarint() != 250 || d.String() != "r" || d.Uint64() != 9 || d.Uvarint() != 2000 || d.Err() != nil {
		t.Errorf("the fields before the beat moved: %x", b)
	}
}
