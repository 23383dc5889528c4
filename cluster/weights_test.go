package cluster

import (
	"reflect"
	"testing"

	"tandem/orpc"
)

func TestWeightsRoundTrip(t *testing.T) {
	card := &ModelCard{Version: Version, Model: "m", Node: "n", Addr: "127.0.0.1:7", Role: RoleBoth, HashVersion: 1,
		BlockSize: 16, KVBlocks: 8, ContextLen: 64, TokenizerFormat: TokenizerGGUF,
		TokenizerFiles: []File{{Name: "tokenizer.gguf", Data: []byte("GGUF")}},
		ContentHash:    []byte{1, 2, 3}, Prepared: "cpu avx2",
		Startup: Startup{Weights: WeightsPeer, Phases: []Phase{{"open", 0.01}, {"weights", 1.5}}}, Stages: []int{12, 11, 1},
		KVFormat: "cpu-kv/1 f32, block size 16, 5 layers, 4 KV heads, head dim 8", RouterIndex: 1, Routers: 3}
	roundTrip(t, card)
	roundTrip(t, &WeightPeersRequest{Model: "m", ContentHash: []byte{9, 9}})
	roundTrip(t, &WeightPeers{Peers: []WeightPeer{{Node: "a", Addr: "127.0.0.1:1", Prepared: "cpu avx2"}, {Node: "b", Addr: "[::1]:2"}}})
	roundTrip(t, &WeightsRequest{ContentHash: []byte{7}, Weights: []WantedWeight{{"output.weight", "cpu-pack/q8_0.vnni/1", 1 << 20}},
		Stream: 1, Streams: 4, ChunkBytes: 1 << 20})
	roundTrip(t, &WeightChunk{Weight: 3, Offset: 1 << 30, CRC: 0xdeadbeef, Data: []byte("bytes")})
	if got := card.Startup.Total(); got != 1.51 {
		t.Errorf("Total = %v", got)
	}
}

// TestCardFromOlderEngine: a card without the trailing fields (an engine from before
// them) decodes with them empty.
func TestCardFromOlderEngine(t *testing.T) {
	old := &ModelCard{Version: Version, Model: "m", Node: "n", Addr: "a:1", Role: RoleBoth, BlockSize: 16, ChatTemplate: "t"}
	b := orpc.Marshal(old)
	b = b[:len(b)-2-1-1-4] // router 0 of 0; the empty KV format; the empty stages; hash, prepared key, weights source and phase count
	var got ModelCard
	if err := orpc.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&got, old) {
		t.Errorf("old card decoded as %+v, want %+v", got, *old)
	}
}

// TestCardStagesFromOlderEngine: a card without the pipeline stages (an engine from
// before them) is one process; a card of too many stages is refused.
func TestCardStagesFromOlderEngine(t *testing.T) {
	b := orpc.Marshal(&ModelCard{Version: Version, Model: "m", Stages: []int{2, 2}})
	var got ModelCard
	if err := orpc.Unmarshal(b[:len(b)-2-1-3], &got); err != nil || got.Stages != nil {
		t.Errorf("card without stages: %+v, %v", got, err)
	}
	// Without the KV format (an engine from before the router paired formats): "", which
	// pairs with any.
	b = orpc.Marshal(&ModelCard{Version: Version, Model: "m", Stages: []int{2, 2}, KVFormat: "f"})
	got = ModelCard{KVFormat: "left over"}
	if err := orpc.Unmarshal(b[:len(b)-2-2], &got); err != nil || got.KVFormat != "" || len(got.Stages) != 2 {
		t.Errorf("card without a KV format: %+v, %v", got, err)
	}
	big := orpc.Marshal(&ModelCard{Version: Version, Model: "m", Stages: make([]int, maxStages+1)})
	if err := orpc.Unmarshal(big, &got); err == nil {
		t.Errorf("a card of %d stages was taken", maxStages+1)
	}
}

// TestCardRouters: a card without the router's place (an engine from before routers'
// shares) says 0 of 0; a place past the count is refused.
func TestCardRouters(t *testing.T) {
	b := orpc.Marshal(&ModelCard{Version: Version, Model: "m", KVFormat: "f", RouterIndex: 1, Routers: 2})
	got := ModelCard{RouterIndex: 5, Routers: 9}
	if err := orpc.Unmarshal(b[:len(b)-2], &got); err != nil || got.RouterIndex != 0 || got.Routers != 0 || got.KVFormat != "f" {
		t.Errorf("card without the router's place: %+v, %v", got, err)
	}
	for _, c := range [][2]int{{2, 2}, {0, maxRouters + 1}} {
		b := orpc.Marshal(&ModelCard{Version: Version, Model: "m", RouterIndex: c[0], Routers: c[1]})
		if err := orpc.Unmarshal(b, &got); err == nil {
			t.Errorf("a card placing its router %d of %d was taken", c[0], c[1])
		}
	}
}

func TestWeightsRequestRefused(t *testing.T) {
	for _, r := range []WeightsRequest{
		{Stream: 0, Streams: 0, ChunkBytes: 1},
		{Stream: 2, Streams: 2, ChunkBytes: 1},
		{Stream: 0, Streams: MaxWeightStreams + 1, ChunkBytes: 1},
		{Stream: 0, Streams: 1, ChunkBytes: 0},
		{Stream: 0, Streams: 1, ChunkBytes: MaxWeightChunk + 1},
	} {
		if err := orpc.Unmarshal(orpc.Marshal(&r), new(WeightsRequest)); err == nil {
			t.Errorf("%+v accepted", r)
		}
	}
}

// TestStreamChunks: the streams of a pull carry every chunk of every weight once, whole.
func TestStreamChunks(t *testing.T) {
	r := WeightsRequest{Weights: []WantedWeight{{Size: 10}, {Size: 0}, {Size: 3}, {Size: 8}}, ChunkBytes: 4}
	for streams := 1; streams <= 5; streams++ {
		covered := make([][]bool, len(r.Weights))
		for i, w := range r.Weights {
			covered[i] = make([]bool, w.Size)
		}
		for s := range streams {
			r.Stream, r.Streams = s, streams
			for c := range r.StreamChunks() {
				if c.N <= 0 || c.N > 4 {
					t.Fatalf("chunk %+v", c)
				}
				for b := c.Off; b < c.Off+c.N; b++ {
					if covered[c.Weight][b] {
						t.Fatalf("%d streams: byte %d of weight %d twice", streams, b, c.Weight)
					}
					covered[c.Weight][b] = true
				}
			}
		}
		for i := range covered {
			for b, ok := range covered[i] {
				if !ok {
					t.Fatalf("%d streams: byte %d of weight %d missing", streams, b, i)
				}
			}
		}
	}
}
