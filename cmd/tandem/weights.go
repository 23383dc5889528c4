package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"tandem/hal"
	"tandem/internal/filehash"
	"tandem/model"
	"tandem/modelgen"
	"tandem/node"
	"tandem/packcache"
)

// processStart is when this process started, near enough: the start-up's phases are
// measured from it.
var processStart = time.Now()

// weightsFlags are serve's flags for where the prepared weights come from.
type weightsFlags struct {
	packCache string
	from      stringList
	noPeers   bool
	streams   int
	sendRate  string
}

func addWeightsFlags(fs *flag.FlagSet) *weightsFlags {
	w := &weightsFlags{}
	fs.StringVar(&w.packCache, "pack-cache", "", "keep the backend's prepared (packed) weights in this directory and map them at the next start instead of repacking (checked against the model's content hash, the backend and its CPU features)")
	fs.Var(&w.from, "weights-from", "an engine's ORPC address HOST:PORT serving the same model file: pull its prepared weights instead of preparing them (needs --join; repeatable, tried in order; falls back to the model file)")
	fs.BoolVar(&w.noPeers, "no-weight-peers", false, "with --join: do not ask the routers for engines of the same model to pull prepared weights from")
	fs.IntVar(&w.streams, "weights-streams", 0, "concurrent streams of a weights pull (default 4)")
	fs.StringVar(&w.sendRate, "weights-send-rate", "", "cap on the bandwidth this engine serves weights pulls at, all together, e.g. 500MB (bytes per second; default unlimited)")
	return w
}

// parse checks the flags against --join and the backend.
func (w *weightsFlags) parse(joins []string, sim bool) (node.Weights, error) {
	out := node.Weights{PackCache: w.packCache, From: w.from, NoPeers: w.noPeers, PullStreams: w.streams}
	if len(w.from) > 0 && len(joins) == 0 {
		return out, errors.New("--weights-from needs --join: a peer serves its weights only to a cluster member (the pull needs the cluster certificate the join gives)")
	}
	if sim && (len(w.from) > 0 || w.packCache != "") {
		return out, errors.New("--weights-from and --pack-cache: the sim backend reads no weights")
	}
	if w.streams < 0 || w.streams > 64 {
		return out, fmt.Errorf("--weights-streams %d: want 1 to 64", w.streams)
	}
	for _, a := range w.from {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return out, fmt.Errorf("--weights-from %q: want HOST:PORT", a)
		}
	}
	if w.sendRate != "" {
		r, err := parseBytes(w.sendRate)
		if err != nil || r <= 0 {
			return out, fmt.Errorf("--weights-send-rate %q: want a positive number of bytes per second", w.sendRate)
		}
		out.SendRate = float64(r)
	}
	return out, nil
}

// progressPrinters is a progress bar per phase of preparing the weights, on a terminal.
func progressPrinters(w io.Writer) func(what string, done, total int64) {
	bars := map[string]func(done, total int64){}
	var mu sync.Mutex // a pull's streams report from their goroutines
	return func(what string, done, total int64) {
		mu.Lock()
		defer mu.Unlock()
		p, ok := bars[what]
		if !ok {
			p = progressPrinter(w, what)
			bars[what] = p
		}
		if p != nil {
			p(done, total)
		}
	}
}

// weightsLine says where the weights came from, for the banner.
func weightsLine(st node.StartupReport) string {
	s := st.Weights + " " + st.From
	if st.Packed > 0 || st.Imported > 0 {
		s += fmt.Sprintf(" (%d packed, %d imported)", st.Packed, st.Imported)
	}
	if len(st.Fallbacks) > 0 {
		s += "; not used: " + strings.Join(st.Fallbacks, ", ")
	}
	return s
}

// phasesLine is each start-up phase's time.
func phasesLine(st node.StartupReport) string {
	var parts []string
	for _, p := range st.Phases {
		parts = append(parts, fmt.Sprintf("%s %.3fs", p.Name, p.Seconds))
	}
	return strings.Join(parts, ", ")
}

// benchPackCache gives be the model's prepared weights from the pack cache in dir, or,
// when it does not hold them, prepares them and writes it (bench-engine's --pack-cache).
func benchPackCache(dir, modelPath string, dev hal.Backend, m *model.Model, stderr io.Writer) error {
	be, ok := dev.(hal.WeightPorter)
	if !ok {
		return fmt.Errorf("--pack-cache: the %s backend keeps no prepared weights to cache", dev.Name())
	}
	workers := 1
	if t, ok := dev.(interface{ Threads() int }); ok {
		workers = t.Threads()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("--pack-cache: %w", err)
	}
	var sum filehash.Sum
	if modelPath == "" {
		data, err := modelgen.DemoGGUF()
		if err != nil {
			return err
		}
		sum = filehash.Bytes(data)
	} else {
		r, err := filehash.Of(modelPath, dir)
		if err != nil {
			return err
		}
		sum = r.Sum
	}
	key := packcache.Key{Model: sum, Backend: be.PreparedKey()}
	path := packcache.Path(dir, modelPath)
	ws := m.Matrices()
	ld, err := packcache.Load(path, key, be, ws, workers)
	if err == nil {
		fmt.Fprintf(stderr, "pack cache: %d weights (%s) mapped from %s\n", ld.Weights, formatBytes(ld.Bytes), path)
		return nil
	}
	fmt.Fprintf(stderr, "pack cache: not used (%v); writing it\n", err)
	m.Prefault(dev, nil)
	size, err := packcache.Save(context.Background(), path, key, be, ws)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "pack cache: wrote %s to %s\n", formatBytes(size), path)
	return nil
}
