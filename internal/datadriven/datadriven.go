// Package datadriven runs tests written as scripts of commands and their expected output, in
// the manner of etcd raft's and CockroachDB's data-driven tests; -rewrite updates the files.
package datadriven

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output of data-driven test files with what the tests print")

// A file is a sequence of cases. Each case is a command line, optional input lines, a
// separator line "----" and the expected output, which ends at a blank line:
//
//	# comments and blank lines come between cases
//	add id=1 prompt=10
//	----
//	waiting 1
//
// Output that holds blank lines goes between two double separators ("----" twice before,
// "----" twice after). A command line is a name and key=value arguments, separated by
// spaces.

// TestData is one case of a file.
type TestData struct {
	Pos      string // file:line of the command, for messages
	Cmd      string
	Args     []Arg
	Input    string // the lines between the command and the separator
	Expected string

	used map[string]bool
}

// Arg is one key=value argument; a bare key has an empty Val.
type Arg struct {
	Key, Val string
}

// Has reports whether key was given.
func (d *TestData) Has(key string) bool {
	_, ok := d.lookup(key)
	return ok
}

func (d *TestData) lookup(key string) (string, bool) {
	for _, a := range d.Args {
		if a.Key == key {
			if d.used == nil {
				d.used = map[string]bool{}
			}
			d.used[key] = true
			return a.Val, true
		}
	}
	return "", false
}

// Str returns key's value, or def when it was not given.
func (d *TestData) Str(key, def string) string {
	if v, ok := d.lookup(key); ok {
		return v
	}
	return def
}

// Int returns key's value as an integer, or def when it was not given; a value that is not
// an integer fails t.
func (d *TestData) Int(t testing.TB, key string, def int) int {
	t.Helper()
	v, ok := d.lookup(key)
	if !ok {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("%s: %s=%q is not an integer", d.Pos, key, v)
	}
	return n
}

// CheckArgs fails t if an argument was given that none of Has, Str and Int asked for: a
// misspelt key must not be ignored.
func (d *TestData) CheckArgs(t testing.TB) {
	t.Helper()
	for _, a := range d.Args {
		if !d.used[a.Key] {
			t.Fatalf("%s: %s does not take argument %q", d.Pos, d.Cmd, a.Key)
		}
	}
}

// ParseFile reads the cases of the file at path.
func ParseFile(path string) ([]*TestData, error) {
	f, err := parse(path)
	if err != nil {
		return nil, err
	}
	return f.cases, nil
}

// file is a parsed file: its cases and, for a rewrite, the text before each separator.
type file struct {
	cases []*TestData
	heads []string // raw text from the end of the previous case up to its separator
	tail  string   // text after the last case
}

func parse(path string) (*file, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.SplitAfter(string(data), "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	f := &file{}
	var head strings.Builder
	for i := 0; i < len(lines); i++ {
		line := strings.TrimRight(lines[i], "\n")
		head.WriteString(lines[i])
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		d := &TestData{Pos: fmt.Sprintf("%s:%d", path, i+1)}
		fields := strings.Fields(trimmed)
		d.Cmd = fields[0]
		for _, fl := range fields[1:] {
			k, v, _ := strings.Cut(fl, "=")
			d.Args = append(d.Args, Arg{Key: k, Val: v})
		}
		var input []string
		for i++; ; i++ {
			if i >= len(lines) {
				return nil, fmt.Errorf("%s: no ---- after the command", d.Pos)
			}
			head.WriteString(lines[i])
			if strings.TrimRight(lines[i], "\n") == "----" {
				break
			}
			input = append(input, strings.TrimRight(lines[i], "\n"))
		}
		d.Input = strings.Join(input, "\n")
		var out []string
		if i+1 < len(lines) && strings.TrimRight(lines[i+1], "\n") == "----" {
			// Double separators: the output ends at "----" twice.
			i += 2
			for ; ; i++ {
				if i+1 >= len(lines) {
					return nil, fmt.Errorf("%s: output opened with ---- ---- is not closed", d.Pos)
				}
				if strings.TrimRight(lines[i], "\n") == "----" && strings.TrimRight(lines[i+1], "\n") == "----" {
					i++
					break
				}
				out = append(out, strings.TrimRight(lines[i], "\n"))
			}
		} else {
			for i++; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
				out = append(out, strings.TrimRight(lines[i], "\n"))
			}
			i-- // the blank line, if any, belongs to what follows
		}
		d.Expected = strings.Join(out, "\n")
		f.cases = append(f.cases, d)
		f.heads = append(f.heads, head.String())
		head.Reset()
	}
	f.tail = head.String()
	return f, nil
}

// RunFile runs every case of the file at path through fn, which returns what the case
// prints; a difference from the expected output fails t. With -rewrite, the file is
// written back with what fn returned.
func RunFile(t *testing.T, path string, fn func(t *testing.T, d *TestData) string) {
	t.Helper()
	f, err := parse(path)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for i, d := range f.cases {
		got := strings.TrimRight(fn(t, d), "\n")
		if *rewrite {
			out.WriteString(f.heads[i])
			if strings.Contains(got, "\n\n") || strings.HasPrefix(got, "\n") {
				fmt.Fprintf(&out, "----\n%s\n----\n----\n", got)
			} else if got != "" {
				out.WriteString(got + "\n")
			}
			continue
		}
		if got != d.Expected {
			t.Fatalf("%s: %s\n got:\n%s\nwant:\n%s", d.Pos, d.Cmd, indent(got), indent(d.Expected))
		}
	}
	if *rewrite {
		out.WriteString(f.tail)
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func indent(s string) string {
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		b.WriteString("  " + sc.Text() + "\n")
	}
	return b.String()
}
