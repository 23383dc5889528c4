package cluster

import (
	"strings"
	"testing"

	"tandem/llm"
	"tandem/orpc"
)

func TestKVTransferRoundTrip(t *testing.T) {
	layout := KVLayout{Store: "*cpu.kvStore", DType: "f32", BlockSize: 16, Layers: 12, KVHeads: 4, HeadDim: 64}
	gen := GenerateRequest{Request: llm.Request{ID: "r", Prompt: []int32{1, 2, 3}, MaxTokens: 9, Resumed: 1}, PredictedCached: 16}
	roundTrip(t, &PrefillRequest{Generate: gen, HoldMs: 30000, TransferID: 0xfeedface})
	roundTrip(t, &PrefillReply{First: GenerateEvent{Kind: EventToken, Event: llm.Event{Token: 5, Logprob: -1}}, Handle: 7, Blocks: 3, Layout: layout})
	roundTrip(t, &DecodeRequest{Generate: gen, Source: KVSource{Addr: "127.0.0.1:9", Node: "p1", Handle: 7, PromptLen: 3, TimeoutMs: 500, Strict: true}})
	roundTrip(t, &PullRequest{Handle: 7, Layout: layout, Hashes: []uint64{1, 2, 3}})
	roundTrip(t, &PullRequest{Layout: layout, Hashes: []uint64{1, 2, 3}, Cached: true})
	data := []byte("block bytes")
	roundTrip(t, &KVBlock{Index: 2, Hash: 99, CRC: BlockCRC(data), Data: data})
	roundTrip(t, &ReleaseRequest{Handle: 7})
	roundTrip(t, &ReleaseReply{Released: true})

	// A prefill request of the first version (no transfer id) still decodes.
	old := orpc.Marshal(&PrefillRequest{Generate: gen, HoldMs: 5})
	var r PrefillRequest
	if err := orpc.Unmarshal(old[:len(old)-8], &r); err != nil || r.HoldMs != 5 || r.TransferID != 0 {
		t.Errorf("prefill request without a transfer id: %+v, %v", r, err)
	}
}

func TestKVBlockVerify(t *testing.T) {
	data := []byte("0123456789abcdef")
	b := KVBlock{Index: 1, Hash: 2, CRC: BlockCRC(data), Data: append([]byte(nil), data...)}
	if err := b.Verify(); err != nil {
		t.Fatal(err)
	}
	b.Data[3] ^= 1
	if err := b.Verify(); err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Errorf("a flipped bit passed: %v", err)
	}
}

func TestDecodeRequestPromptLenBound(t *testing.T) {
	b := orpc.Marshal(&DecodeRequest{Generate: GenerateRequest{Request: llm.Request{Prompt: []int32{1, 2}}}, Source: KVSource{PromptLen: 3}})
	if err := orpc.Unmarshal(b, &DecodeRequest{}); err == nil {
		t.Error("a KV source longer than the prompt was accepted")
	}
}

// A hold or a pull deadline from the wire is bounded: a larger one is refused rather than
// overflowing a time.Duration or pinning blocks for ever.
func TestDurationsBounded(t *testing.T) {
	const day = 24 * 60 * 60 * 1000
	for _, ms := range []int{day + 1, 1 << 60} {
		if err := orpc.Unmarshal(orpc.Marshal(&PrefillRequest{HoldMs: ms}), &PrefillRequest{}); err == nil {
			t.Errorf("hold of %d ms accepted", ms)
		}
		dr := &DecodeRequest{Generate: GenerateRequest{Request: llm.Request{Prompt: []int32{1}}}, Source: KVSource{PromptLen: 1, TimeoutMs: ms}}
		if err := orpc.Unmarshal(orpc.Marshal(dr), &DecodeRequest{}); err == nil {
			t.Errorf("pull deadline of %d ms accepted", ms)
		}
	}
	var got PrefillRequest
	if err := orpc.Unmarshal(orpc.Marshal(&PrefillRequest{HoldMs: day}), &got); err != nil || got.HoldMs != day {
		t.Errorf("a day's hold: %v, %d", err, got.HoldMs)
	}
}

// The messages a worker decodes from its peers never panic on arbitrary bytes.
func FuzzKVTransferMessages(f *testing.F) {
	f.Add(orpc.Marshal(&PullRequest{Handle: 1, Layout: KVLayout{DType: "f32", BlockSize: 16}, Hashes: []uint64{5}}))
	f.Add(orpc.Marshal(&KVBlock{Index: 1, Hash: 2, CRC: 3, Data: []byte{4, 5}}))
	f.Add(orpc.Marshal(&DecodeRequest{Generate: GenerateRequest{Request: llm.Request{Prompt: []int32{1}}}, Source: KVSource{Addr: "a", PromptLen: 1}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, m := range []orpc.Unmarshaler{&PrefillRequest{}, &PrefillReply{}, &DecodeRequest{}, &PullRequest{}, &KVBlock{}, &ReleaseRequest{}, &ReleaseReply{}} {
			_ = orpc.Unmarshal(b, m)
		}
	})
}
