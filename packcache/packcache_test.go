package packcache

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tandem/hal"
	"tandem/hal/cpu"
	"tandem/internal/filehash"
)

// testWeights returns weights of four formats that pack under avx2 and avx512vnni.
func testWeights(seed uint64) []*hal.Weight {
	r := rand.New(rand.NewPCG(seed, 1))
	var ws []*hal.Weight
	for i, typ := range []hal.DType{hal.Q8_0, hal.Q4_K, hal.Q6_K, hal.F16} {
		k := 256
		rb, _ := typ.RowBytes(k)
		rows := 40 + i
		data := make([]byte, 0, rows*rb)
		row := make([]float32, k)
		q := make([]byte, rb)
		for range rows {
			for j := range row {
				row[j] = float32(r.NormFloat64())
			}
			cpu.QuantizeRow(typ, row, q)
			data = append(data, q...)
		}
		ws = append(ws, &hal.Weight{Name: "blk." + typ.String(), Type: typ, Rows: rows, Cols: k, Data: data})
	}
	return ws
}

func clone(ws []*hal.Weight) []*hal.Weight {
	out := make([]*hal.Weight, len(ws))
	for i, w := range ws {
		c := *w
		c.Data = append([]byte(nil), w.Data...)
		out[i] = &c
	}
	return out
}

func key(be hal.WeightPorter) Key {
	return Key{Model: filehash.Bytes([]byte("the model")), Backend: be.PreparedKey()}
}

// saved writes a cache of testWeights made by a fresh backend and returns its path.
func saved(t *testing.T) (string, []*hal.Weight) {
	t.Helper()
	be := cpu.New(2)
	defer be.Close()
	ws := testWeights(1)
	if len(Prepared(be, ws)) == 0 {
		t.Skipf("no packed layouts under ISA %s on this CPU: nothing to cache", cpu.KernelISA())
	}
	path := Path(t.TempDir(), "/models/m.gguf")
	if _, err := Save(context.Background(), path, key(be), be, ws); err != nil {
		t.Fatal(err)
	}
	return path, ws
}

// TestRoundTrip: a second backend loading the cache packs nothing, and computes the
// bits the first one does.
func TestRoundTrip(t *testing.T) {
	path, ws := saved(t)
	a := cpu.New(2)
	defer a.Close()
	b := cpu.New(2)
	defer b.Close()
	bws := clone(ws)
	ld, err := Load(path, key(b), b, bws, 2)
	if err != nil {
		t.Fatal(err)
	}
	if ld.Weights != len(ws) {
		t.Errorf("loaded %+v, want %d weights", ld, len(ws))
	}
	r := rand.New(rand.NewPCG(5, 6))
	for i, w := range ws {
		x := make([]float32, 3*w.Cols)
		for j := range x {
			x[j] = float32(r.NormFloat64())
		}
		want, got := make([]float32, 3*w.Rows), make([]float32, 3*w.Rows)
		a.MatMul(hal.HostBuf(want), hal.HostBuf(x), 3, w)
		b.MatMul(hal.HostBuf(got), hal.HostBuf(x), 3, bws[i])
		for j := range want {
			if math.Float32bits(want[j]) != math.Float32bits(got[j]) {
				t.Fatalf("%s output %d: %g from the cache, %g packed", w.Name, j, got[j], want[j])
			}
		}
	}
	if packed, imported := b.PreparedCounts(); packed != 0 || imported != len(ws) {
		t.Errorf("loading backend: %d packed, %d imported, want nothing packed", packed, imported)
	}
}

// TestRejected: every kind of damage or mismatch is an error of its kind that says what,
// and leaves the backend without imports (it packs as if there were no cache).
func TestRejected(t *testing.T) {
	path, ws := saved(t)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	flip := func(off int) func([]byte) []byte {
		return func(b []byte) []byte { b[off] ^= 0x40; return b }
	}
	tail := len(orig) - 100 // inside the last weight's bytes
	for _, tc := range []struct {
		name   string
		edit   func([]byte) []byte // of the file
		key    func(Key) Key
		ws     func([]*hal.Weight) []*hal.Weight
		kind   error
		saying string
	}{
		{name: "absent", edit: func([]byte) []byte { return nil }, kind: ErrAbsent},
		{name: "truncated", edit: func(b []byte) []byte { return b[:len(b)/2] }, kind: ErrCorrupt, saying: "outside the file"},
		{name: "truncated header", edit: func(b []byte) []byte { return b[:30] }, kind: ErrCorrupt, saying: "header"},
		{name: "empty", edit: func([]byte) []byte { return []byte{} }, kind: ErrCorrupt},
		{name: "not a cache", edit: func(b []byte) []byte { return append([]byte("GGUF"), b[4:]...) }, kind: ErrCorrupt, saying: "not a pack cache"},
		{name: "header bit", edit: flip(preamble + 10), kind: ErrCorrupt, saying: "checksum"},
		{name: "weight bit", edit: flip(tail), kind: ErrCorrupt, saying: ws[len(ws)-1].Name},
		{name: "format version", edit: func(b []byte) []byte { b[8] = FormatVersion + 1; return b }, kind: ErrStale, saying: "file format"},
		{name: "other model", key: func(k Key) Key { k.Model = filehash.Bytes([]byte("another")); return k }, kind: ErrStale, saying: "content hash"},
		{name: "other ISA", key: func(k Key) Key { k.Backend = "cpu avx2"; return k }, kind: ErrStale, saying: "backend"},
		{name: "missing weight", ws: func(ws []*hal.Weight) []*hal.Weight {
			c := *ws[0]
			c.Name = "blk.new"
			return append(ws, &c)
		}, kind: ErrStale, saying: "blk.new"},
		{name: "other shape", ws: func(ws []*hal.Weight) []*hal.Weight {
			ws[0].Rows--
			ws[0].Data = ws[0].Data[:len(ws[0].Data)-ws[0].RowBytes()]
			return ws
		}, kind: ErrStale, saying: ws[0].Name},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "c.tpack")
			b := append([]byte(nil), orig...)
			if tc.edit != nil {
				b = tc.edit(b)
			}
			if b != nil {
				if err := os.WriteFile(p, b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			be := cpu.New(1)
			defer be.Close()
			k := key(be)
			if tc.key != nil {
				k = tc.key(k)
			}
			bws := clone(ws)
			if tc.ws != nil {
				bws = tc.ws(bws)
			}
			_, err := Load(p, k, be, bws, 2)
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.saying) {
				t.Fatalf("Load: %v, want %v saying %q", err, tc.kind, tc.saying)
			}
			if want := map[error]string{ErrAbsent: "absent", ErrStale: "stale", ErrCorrupt: "corrupt"}[tc.kind]; Describe(err) != want {
				t.Errorf("Describe = %q, want %q", Describe(err), want)
			}
			if _, imported := be.PreparedCounts(); imported != 0 {
				t.Errorf("%d imported after a refused cache", imported)
			}
		})
	}
}

// TestSaveCanceled: a Save cut short leaves the old cache in place, whole.
func TestSaveCanceled(t *testing.T) {
	path, ws := saved(t)
	orig, _ := os.ReadFile(path)
	be := cpu.New(1)
	defer be.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Save(ctx, path, key(be), be, ws); !errors.Is(err, context.Canceled) {
		t.Fatalf("Save: %v", err)
	}
	if now, _ := os.ReadFile(path); string(now) != string(orig) {
		t.Error("a canceled Save changed the cache")
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Errorf("%d files left in the directory, want the cache alone", len(ents))
	}
}

func TestPathPerModel(t *testing.T) {
	a, b := Path("/c", "/x/model.gguf"), Path("/c", "/y/model.gguf")
	if a == b || filepath.Dir(a) != "/c" || !strings.HasPrefix(filepath.Base(a), "model.gguf-") {
		t.Errorf("Path: %s and %s", a, b)
	}
}
