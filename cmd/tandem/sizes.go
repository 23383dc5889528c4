package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// parseBytes reads sizes like "4GiB", "512MB", "2g" or a plain byte count.
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(strings.ToLower(s))
	units := []struct {
		suffix string
		mult   int64
	}{
		{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
		{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
		{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"t", 1 << 40}, {"b", 1},
	}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseFloat(t, 64)
	if err != nil || v <= 0 || v*float64(mult) > 1<<60 {
		return 0, fmt.Errorf("invalid size %q (want e.g. 4GiB or 512MB)", s)
	}
	return int64(v * float64(mult)), nil
}

func formatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	default:
		return fmt.Sprintf("%d KiB", n>>10)
	}
}

func modelName(path, metaName string) string {
	if path == "" {
		return "tandem-demo"
	}
	if metaName != "" {
		return metaName
	}
	return strings.TrimSuffix(filepath.Base(path), ".gguf")
}

func sourceName(path string) string {
	if path == "" {
		return "built-in demo weights (seed 42)"
	}
	return path
}

// progressPrinter returns a callback drawing a progress line on w when w is
// a terminal, and nil otherwise.
func progressPrinter(w io.Writer, what string) func(done, total int64) {
	f, ok := w.(*os.File)
	if !ok {
		return nil
	}
	if st, err := f.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	last := -1
	return func(done, total int64) {
		pct := int(done * 100 / max(total, 1))
		if pct == last {
			return
		}
		last = pct
		bar := strings.Repeat("█", pct/4) + strings.Repeat("░", 25-pct/4)
		fmt.Fprintf(f, "\r%s %s %3d%% of %s", what, bar, pct, formatBytes(total))
		if done >= total {
			fmt.Fprintln(f)
		}
	}
}
