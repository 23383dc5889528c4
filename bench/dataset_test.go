package bench

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
)

func readFileWith[T any](path string, parse func(io.Reader) (T, error)) (T, error) {
	f, err := os.Open(path)
	if err != nil {
		var zero T
		return zero, err
	}
	defer f.Close()
	return parse(f)
}

func TestParseMooncake(t *testing.T) {
	good := `{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}

{"timestamp": 27, "input_length": 10, "output_length": 1, "hash_ids": [1]}`
	rows, err := ParseMooncake(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	want := []TraceRow{{0, 600, 5, []int64{1, 2}}, {27, 10, 1, []int64{1}}}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("rows %+v", rows)
	}
	for _, bad := range []string{
		`{"timestamp": 5}` + "\n" + `{"timestamp": 4}`,
		`{"timestamp": -1}`,
		`{"input_length": -3}`,
		`{"timestamp": 0} {"timestamp": 1}`,
		`[1, 2]`,
		`{"timestamp": "x"}`,
		`{"timestamp": 0`,
	} {
		if _, err := ParseMooncake(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseMooncake(%q): no error", bad)
		}
	}
	// Too few hash ids for the input length is the replay's error.
	if _, err := Mooncake([]TraceRow{{0, 1025, 1, []int64{1, 2}}}, MooncakeOptions{}); err == nil {
		t.Error("Mooncake with too few hash ids: no error")
	}
}

func TestParseShareGPT(t *testing.T) {
	in := `[{"id": "a", "conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello"}]},
	{"id": "b", "conversations": [{"from": "gpt", "value": "x"}, {"from": "human", "value": "second"}]},
	{"id": "c", "conversations": [{"role": "user", "content": "openai style"}]},
	{"id": "d", "conversations": [{"from": "human", "value": "  "}]},
	{"id": "e", "conversations": []}]`
	got, err := ParseShareGPT(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"Hi there", "second", "openai style"}; !reflect.DeepEqual(got, want) {
		t.Errorf("prompts %q, want %q", got, want)
	}
	for _, bad := range []string{`{}`, `[1]`, `[] []`, `[{"conversations": 3}]`, ``} {
		if _, err := ParseShareGPT(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseShareGPT(%q): no error", bad)
		}
	}
}

func FuzzParseMooncake(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2]}` + "\n"))
	f.Add([]byte(`{"timestamp": 3, "input_length": 1, "output_length": 1, "hash_ids": [7]}` + "\n\n" + `{"timestamp": 3, "input_length": 513, "output_length": 0, "hash_ids": [7, 8]}`))
	f.Add([]byte(`{"timestamp": 1e3}`))
	f.Add([]byte("\n\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		rows, err := ParseMooncake(bytes.NewReader(data))
		if err != nil {
			return
		}
		var buf bytes.Buffer
		for i, r := range rows {
			if r.Timestamp < 0 || r.InputLength < 0 || r.OutputLength < 0 || (i > 0 && r.Timestamp < rows[i-1].Timestamp) {
				t.Fatalf("row %d accepted: %+v", i, r)
			}
			b, _ := json.Marshal(r)
			buf.Write(b)
			buf.WriteByte('\n')
		}
		again, err := ParseMooncake(&buf)
		if err != nil || len(again) != len(rows) {
			t.Fatalf("re-parsing %d rows: %d, %v", len(rows), len(again), err)
		}
		// A replay either refuses the rows or builds prompts of their lengths.
		w, err := Mooncake(rows, MooncakeOptions{})
		if err != nil {
			return
		}
		for i, s := range w.Sessions() {
			if got := s.Turns[0].InputLen(); got != rows[i].InputLength {
				t.Fatalf("row %d: prompt of %d tokens, input_length %d", i, got, rows[i].InputLength)
			}
		}
	})
}

func FuzzParseShareGPT(f *testing.F) {
	f.Add([]byte(`[{"id": "x", "conversations": [{"from": "human", "value": "How?"}]}]`))
	f.Add([]byte(`[{"conversations": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}]`))
	f.Add([]byte(`[]`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		prompts, err := ParseShareGPT(bytes.NewReader(data))
		if err != nil {
			return
		}
		for _, p := range prompts {
			if strings.TrimSpace(p) == "" {
				t.Fatalf("empty prompt accepted from %q", data)
			}
		}
		if len(prompts) > 0 {
			if _, err := ShareGPT(prompts, 0, 16, 1); err != nil {
				t.Fatal(err)
			}
		}
	})
}
