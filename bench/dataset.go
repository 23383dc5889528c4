package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// TraceRow is one request of a Mooncake trace (FAST'25 format).
type TraceRow struct {
	Timestamp    int64   `json:"timestamp"`     // ms since the trace's start
	InputLength  int     `json:"input_length"`  // prompt tokens
	OutputLength int     `json:"output_length"` // generated tokens
	HashIDs      []int64 `json:"hash_ids"`      // prefix-block hashes, one per block
}

// maxTraceLen bounds a trace row's lengths, to refuse garbage early.
const maxTraceLen = 1 << 24

// ParseMooncake reads a Mooncake trace: one JSON object per line, blank
// lines skipped.
func ParseMooncake(r io.Reader) ([]TraceRow, error) {
	br := bufio.NewReader(r)
	var rows []TraceRow
	for line := 1; ; line++ {
		b, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(b)) > 0 {
			var row TraceRow
			dec := json.NewDecoder(bytes.NewReader(b))
			if derr := dec.Decode(&row); derr != nil {
				return nil, fmt.Errorf("bench: trace line %d: %v", line, derr)
			}
			if dec.More() {
				return nil, fmt.Errorf("bench: trace line %d: more than one JSON value", line)
			}
			switch {
			case row.Timestamp < 0:
				return nil, fmt.Errorf("bench: trace line %d: negative timestamp %d", line, row.Timestamp)
			case row.InputLength < 0 || row.InputLength > maxTraceLen:
				return nil, fmt.Errorf("bench: trace line %d: input_length %d outside [0, %d]", line, row.InputLength, maxTraceLen)
			case row.OutputLength < 0 || row.OutputLength > maxTraceLen:
				return nil, fmt.Errorf("bench: trace line %d: output_length %d outside [0, %d]", line, row.OutputLength, maxTraceLen)
			case len(rows) > 0 && row.Timestamp < rows[len(rows)-1].Timestamp:
				return nil, fmt.Errorf("bench: trace line %d: timestamp %d before the previous row's %d", line, row.Timestamp, rows[len(rows)-1].Timestamp)
			}
			rows = append(rows, row)
		}
		if errors.Is(err, io.EOF) {
			return rows, nil
		}
		if err != nil {
			return nil, fmt.Errorf("bench: reading trace: %w", err)
		}
	}
}

// shareGPTEntry is one conversation of a ShareGPT-style file. Turns carry
// from/value (ShareGPT) or role/content (OpenAI style).
type shareGPTEntry struct {
	ID            string `json:"id"`
	Conversations []struct {
		From    string `json:"from"`
		Value   string `json:"value"`
		Role    string `json:"role"`
		Content string `json:"content"`
	} `json:"conversations"`
}

// ParseShareGPT reads a ShareGPT-style JSON array and returns each
// conversation's first human prompt, as vLLM's ShareGPT loader does.
// Conversations without one are skipped.
func ParseShareGPT(r io.Reader) ([]string, error) {
	var entries []shareGPTEntry
	dec := json.NewDecoder(r)
	if err := dec.Decode(&entries); err != nil {
		return nil, fmt.Errorf("bench: ShareGPT file: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("bench: ShareGPT file: data after the JSON array")
	}
	var prompts []string
	for _, e := range entries {
		for _, t := range e.Conversations {
			who, text := t.From, t.Value
			if who == "" {
				who, text = t.Role, t.Content
			}
			if who == "human" || who == "user" {
				if strings.TrimSpace(text) != "" {
					prompts = append(prompts, text)
				}
				break
			}
		}
	}
	return prompts, nil
}
