package datadriven

import (
	"os"
	"path/filepath"
	"testing"
)

const script = `# a comment
add id=1 prompt=10 flag
first input line
----
waiting 1

step
----
----
step 1

done 1
----
----

empty
----

`

func TestParse(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.txt")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	cases, err := ParseFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(cases) != 3 {
		t.Fatalf("%d cases, want 3", len(cases))
	}
	add, step, empty := cases[0], cases[1], cases[2]
	if add.Cmd != "add" || add.Input != "first input line" || add.Expected != "waiting 1" || add.Int(t, "prompt", 0) != 10 ||
		!add.Has("flag") || add.Str("missing", "def") != "def" || add.Pos != path+":2" {
		t.Errorf("add: %+v", add)
	}
	if step.Cmd != "step" || step.Expected != "step 1\n\ndone 1" {
		t.Errorf("step: %+v", step)
	}
	if empty.Cmd != "empty" || empty.Expected != "" {
		t.Errorf("empty: %+v", empty)
	}
	if !add.used["prompt"] || add.used["id"] { // CheckArgs would fail now: id was not asked for
		t.Errorf("used %v", add.used)
	}
	add.Int(t, "id", 0)
	add.CheckArgs(t)
}

// A rewrite keeps the commands, inputs and comments and replaces the outputs, blank lines
// within them included; the rewritten file then passes as it is.
func TestRewrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.txt")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	outputs := map[string]string{"add": "waiting 1 2", "step": "a\n\nb", "empty": ""}
	*rewrite = true
	RunFile(t, path, func(t *testing.T, d *TestData) string { return outputs[d.Cmd] })
	*rewrite = false
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "# a comment\nadd id=1 prompt=10 flag\nfirst input line\n----\nwaiting 1 2\n\nstep\n----\n----\na\n\nb\n----\n----\n\nempty\n----\n\n"
	if string(got) != want {
		t.Fatalf("rewritten:\n%s\nwant:\n%s", got, want)
	}
	RunFile(t, path, func(t *testing.T, d *TestData) string { return outputs[d.Cmd] })
}
