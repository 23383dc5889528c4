#!/usr/bin/env bash
# bench/routing-live.sh: the routing study live (docs/routing-study.md, "Live"): one
# tandem-router in front of one tandem serve process of N sim replicas, a Mooncake trace
# slice replayed by tandem bench, each routing mode on a fresh router and fresh replicas.
#
#   bench/routing-live.sh BIN [MODE ...]     # default modes: kv round-robin
#
# BIN is a directory holding tandem and tandem-router (go build -o BIN ./cmd/tandem
# ./cmd/tandem-router). REPLICAS (100), ROWS (1500) and SPEEDUP (4) set the run;
# TRACE is the conversation trace; ROUTER_ARGS adds router flags. Prints tandem bench's
# summary and the router's CPU seconds per request for each mode; compare with
#   tandem simulate --trace SLICE --workers REPLICAS --routing MODE --itl-target 2.5x
# on the same slice with its timestamps divided by SPEEDUP (the serve default ITL target).
set -euo pipefail
BIN=$(cd "$1" && pwd)
shift
MODES=${*:-kv round-robin}
TRACE=${TRACE:-/work/shared/workloads/mooncake/conversation_trace.jsonl}
REPLICAS=${REPLICAS:-100} ROWS=${ROWS:-1500} SPEEDUP=${SPEEDUP:-4}
# shellcheck source=bench/live.sh
. "$(dirname "$0")/live.sh"

for mode in $MODES; do
	D=$(mktemp -d)
	start_live "$D" "$REPLICAS" 480 --routing "$mode"
	c0=$(router_cpu)
	"$BIN/tandem" bench --base-url "http://127.0.0.1:$HP" --workload mooncake --dataset-path "$TRACE" \
		--num-prompts "$ROWS" --trace-speedup "$SPEEDUP" >"$D/bench.log" 2>&1 || true
	c1=$(router_cpu)
	echo "== $mode ($REPLICAS replicas, first $ROWS rows at ${SPEEDUP}x; logs in $D)"
	cat "$D/bench.log"
	n=$(awk -F: '/^Successful requests/ { gsub(/ /, "", $2); print $2 }' "$D/bench.log")
	awk -v c=$((c1 - c0)) -v hz="$(getconf CLK_TCK)" -v n="${n:-0}" 'BEGIN {
		if (n > 0) printf "router CPU %.1f s: %.2f ms per request\n", c / hz, 1000 * c / hz / n }'
	curl -s "localhost:$HP/metrics" | grep -E '^tandem_router:(kv_resyncs_total|worker_deaths_total|requests_failed_total|queue)' | grep -v 'cause="join"' || true
	kill $EPID $RPID 2>/dev/null || true
	wait 2>/dev/null || true
	trap - EXIT
done
