package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// scrapeSum is the sum of the samples of name whose labels include label, from url's
// /metrics (-1 if there are none).
func scrapeSum(t *testing.T, url, name, label string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	rx := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	sum, found := 0.0, false
	for _, m := range rx.FindAllStringSubmatch(string(b), -1) {
		if strings.Contains(m[1], label) {
			v, _ := strconv.ParseFloat(m[2], 64)
			sum, found = sum+v, true
		}
	}
	if !found {
		return -1
	}
	return sum
}

// A router with peer pulls and two engines, real processes on loopback. Round robin sends a
// repeated prompt to the engine that lacks it; the router names the engine that holds it,
// and the chosen engine pulls the prefix from it instead of computing it: its answer
// reports the prefix cached, the text is the holder's, and both sides count the pull.
func TestEndToEndPeerPull(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs three processes")
	}
	p := startProc(t, "tandem-router", "tandem-router", "--port", "0", "--orpc-port", "0", "--state-dir", t.TempDir(),
		"--join-token", e2eToken, "--heartbeat", "100ms", "--heartbeat-timeout", "3s", "--queue-timeout", "2s",
		"--routing", "round-robin", "--peer-pulls", "--peer-min-blocks", "1")
	r := &e2eRouter{proc: p, url: p.wait(t, `tandem-router: (http://\S+)`, 60*time.Second)[1], orpc: p.wait(t, `ORPC for engines: (\S+)`, 10*time.Second)[1]}
	urls := map[string]string{}
	for _, name := range []string{"e1", "e2"} {
		e := startEngineProc(t, name, r.orpc, e2eToken)
		urls[name] = e.wait(t, `tandem serve: (http://\S+)`, 60*time.Second)[1]
		e.wait(t, `registered with router`, 30*time.Second)
		r.wait(t, `worker joined.*worker=`+name, 10*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := sdkClient(r.url)
	long := strings.Repeat("Lily and Ben played in the park with a big red ball. ", 5)
	first, holder, err := completion(ctx, c, long, 4)
	if err != nil {
		t.Fatal(err)
	}
	blocks := int(first.Usage.PromptTokens) / 16
	waitRouterSees(t, r.url, holder, blocks)
	out, puller, err := completion(ctx, c, long, 4)
	if err != nil {
		t.Fatal(err)
	}
	if puller == holder || urls[puller] == "" {
		t.Fatalf("round robin sent the repeat to %q, the holder %q", puller, holder)
	}
	if out.Choices[0].Text != first.Choices[0].Text {
		t.Errorf("after the pull: %q, the holder computed %q", out.Choices[0].Text, first.Choices[0].Text)
	}
	if cached := out.Usage.PromptTokensDetails.CachedTokens; cached < int64(blocks-1)*16 {
		t.Errorf("the puller reports %d of %d prompt tokens cached, want the %d blocks pulled", cached, out.Usage.PromptTokens, blocks-1)
	}
	if n := scrapeSum(t, r.url, "tandem_router:peer_pulls_total", ""); n != 1 {
		t.Errorf("tandem_router:peer_pulls_total %v, want 1\n%s", n, r.text())
	}
	if n := scrapeSum(t, urls[puller], "tandem:kv_peer_pulls_total", `result="ok"`); n != 1 {
		t.Errorf("the puller's tandem:kv_peer_pulls_total{result=\"ok\"} %v, want 1", n)
	}
}
