// Command build builds the test API server into its cache directory (internal/k8stest)
// and prints its path; .ci/run runs it before the tests so that none waits on the build.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"tandem/internal/k8stest"
)

func main() {
	start := time.Now()
	bin, err := k8stest.Binary(context.Background(), os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("%s (%v)\n", bin, time.Since(start).Round(time.Second))
}
