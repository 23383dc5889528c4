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
TOK=abcdef.0123456789abcdef

for mode in $MODES; do
	D=$(mktemp -d)
	HP=$((18000 + RANDOM % 1000)) OP=$((19000 + RANDOM % 1000)) EP=$((20000 + RANDOM % 1000))
	# shellcheck disable=SC2086
	"$BIN/tandem-router" --port $HP --orpc-port $OP --state-dir "$D/router" --join-token $TOK --routing "$mode" \
		--log-level warn ${ROUTER_ARGS:-} >"$D/router.log" 2>&1 &
	RPID=$!
	sleep 1
	"$BIN/tandem" serve --backend sim --replicas "$REPLICAS" --sim-profile gpu --kv-cache-memory 896MiB \
		--max-model-len 131072 --max-seqs 256 --max-batch-tokens 8192 --port $EP --orpc-port 0 \
		--join 127.0.0.1:$OP --join-token $TOK --state-dir "$D/engine" --log-level warn >"$D/engine.log" 2>&1 &
	EPID=$!
	trap 'kill $EPID $RPID 2>/dev/null || true; wait 2>/dev/null || true' EXIT
	for _ in $(seq 1 480); do
		n=$(curl -s "localhost:$HP/metrics" | grep -c '^tandem_router:worker_info' || true)
		[ "$n" -ge "$REPLICAS" ] && break
		sleep 0.5
	done
	sleep 2
	c0=$(awk '{print $14 + $15}' "/proc/$RPID/stat")
	"$BIN/tandem" bench --base-url "http://127.0.0.1:$HP" --workload mooncake --dataset-path "$TRACE" \
		--num-prompts "$ROWS" --trace-speedup "$SPEEDUP" >"$D/bench.log" 2>&1 || true
	c1=$(awk '{print $14 + $15}' "/proc/$RPID/stat")
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
