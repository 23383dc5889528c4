package main

import (
	"errors"
	"flag"
	"io"
)

// errUsage reports that flag parsing already printed what was wrong.
var errUsage = errors.New("usage")

// parseInterleaved parses flags that may come before or after positional
// arguments, as users type them: `tandem run "hi" --max-tokens 5`.
func parseInterleaved(fs *flag.FlagSet, args []string, stderr io.Writer) ([]string, error) {
	fs.SetOutput(stderr)
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, errUsage
			}
			return nil, errUsage
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}
