// Command tandem is the Tandem engine: it runs, serves and generates models.
package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"tandem/internal/version"
)

type command struct {
	name  string
	usage string
	run   func(args []string, stdout, stderr io.Writer) error
}

func commands() []command {
	return []command{
		{"run", "generate text from a prompt", runCmd},
		{"tokenize", "print a text's token ids as JSON", tokenizeCmd},
		{"gen-model", "write a random-weight GGUF model of a given shape and type", genModelCmd},
		{"gen-lora", "write a random LoRA adapter (GGUF or PEFT) for a model, for tests and benchmarks", genLoRACmd},
		{"serve", "serve the OpenAI-compatible API", serveCmd},
		{"cluster", "run a router and its engines on this machine: one command, one URL", clusterCmd},
		{"bench-engine", "time prompt processing, generation and batched decode (like llama-bench)", benchEngineCmd},
		{"bench", "load-test an OpenAI-compatible server", benchCmd},
		{"simulate", "replay a trace over simulated workers with the router's own decisions", simulateCmd},
		{"plan", "size the pools for SLA targets with the planner in the simulator, and judge whether a cluster pays", planCmd},
		{"profile", "time an engine's forward pass and fit the simulator's timing model", profileCmd},
		{"devices", "list the devices --device can name (the CPU, Vulkan devices)", devicesCmd},
	}
}

func main() {
	os.Exit(mainWithArgs(os.Args[1:], os.Stdout, os.Stderr))
}

func mainWithArgs(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version" || args[0] == "version") {
		fmt.Fprintln(stdout, "tandem", version.String())
		return 0
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	for _, c := range commands() {
		if c.name == args[0] {
			if err := c.run(args[1:], stdout, stderr); err != nil {
				if err == errUsage {
					return 2
				}
				fmt.Fprintf(stderr, "tandem %s: %v\n", c.name, err)
				return 1
			}
			return 0
		}
	}
	fmt.Fprintf(stderr, "tandem: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	var b strings.Builder
	b.WriteString("usage: tandem <command> [flags] [args]\n\ncommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(&b, "  %-10s %s\n", c.name, c.usage)
	}
	b.WriteString("\nRun 'tandem <command> -h' for a command's flags, 'tandem --version' for the build.\n")
	io.WriteString(w, b.String())
}
