#!/usr/bin/env bash
# bench/router-cpu.sh: what a live tandem-router costs per routed request, and what it adds
# to the time to first token (docs/routing.md, "The stream, per token").
#
#   bench/router-cpu.sh BIN mooncake  # 16 sim replicas, 100 Mooncake requests at 4x
#   bench/router-cpu.sh BIN small     # 16 sim replicas, 1000 requests of 64 in / 16 out at 50/s
#   bench/router-cpu.sh BIN idle      # 16 idle sim replicas for 20 s (REPLICAS=100: a hundred;
#                                     # IDLE_SECONDS=60: a minute)
#   bench/router-cpu.sh BIN ttft      # one sim replica, one request at a time, through the
#                                     # router and direct, alternated: router-added TTFT
#
# BIN is a directory holding tandem and tandem-router (go build -o BIN ./cmd/tandem
# ./cmd/tandem-router); REPLICAS sets the number of sim replicas (default 16; ttft uses one);
# ROUTER_ARGS adds router flags (ROUTER_ARGS="--stream-interval 16"); BENCH_ARGS adds tandem
# bench flags (BENCH_ARGS='--extra-body {"stream":false,"stream_options":null}': answers
# not streamed);
# TRACE is the Mooncake conversation trace (default /work/shared/workloads/mooncake/...).
# Prints the router process's CPU seconds (from /proc/PID/stat, user and system) over the
# requests routed, and the UDP datagrams the host (or with NETNS=1 the run's own network
# namespace) sent meanwhile (both ends of every QUIC connection: tokens, KV events,
# reports and their ACKs). Linux only.
set -euo pipefail
# NETNS=1 runs it in a network namespace of its own (unshare -n; root), so that the
# datagrams counted are this run's alone, not those of whatever else the host runs.
if [ "${NETNS:-}" = 1 ] && [ -z "${IN_NETNS:-}" ]; then
	exec unshare -n env IN_NETNS=1 bash -c 'ip link set lo up && exec "$0" "$@"' "$0" "$@"
fi
BIN=$(cd "$1" && pwd)
MODE=$2
TRACE=${TRACE:-/work/shared/workloads/mooncake/conversation_trace.jsonl}
D=$(mktemp -d)
REPLICAS=${REPLICAS:-16}
[ "$MODE" = ttft ] && REPLICAS=1

# shellcheck source=bench/live.sh
. "$(dirname "$0")/live.sh"
start_live "$D" $REPLICAS 240

udp() { awk '/^Udp:/ { getline; print $5 }' /proc/net/snmp; }
# shellcheck disable=SC2086
bench() { "$BIN/tandem" bench --base-url "$1" "${@:2}" ${BENCH_ARGS:-}; }

case $MODE in
mooncake | small | idle)
	c0=$(router_cpu) u0=$(udp) t0=$(date +%s.%N)
	case $MODE in
	mooncake) bench http://127.0.0.1:$HP --workload mooncake --dataset-path "$TRACE" --num-prompts 100 --trace-speedup 4 >"$D/bench.log" 2>&1 ;;
	small) bench http://127.0.0.1:$HP --workload random --random-input-len 64 --random-output-len 16 --num-prompts 1000 --request-rate 50 >"$D/bench.log" 2>&1 ;;
	idle) sleep "${IDLE_SECONDS:-20}" ;;
	esac
	c1=$(router_cpu) u1=$(udp) t1=$(date +%s.%N)
	n=$(awk -F: '/^Successful requests/ { gsub(/ /, "", $2); print $2 }' "$D/bench.log" 2>/dev/null || true)
	awk -v c=$((c1 - c0)) -v hz="$(getconf CLK_TCK)" -v n="${n:-0}" -v u=$((u1 - u0)) -v mode="$MODE" -v t0="$t0" -v t1="$t1" 'BEGIN {
		secs = t1 - t0
		s = c / hz
		if (n > 0) printf "%s: router CPU %.2f s over %d requests in %.1f s: %.2f ms per request; %d UDP datagrams sent\n", mode, s, n, secs, 1000 * s / n, u
		else printf "%s: router CPU %.2f s (%.1f ms a second); %d UDP datagrams sent (%.0f a second)\n", mode, s, 1000 * s / secs, u, u / secs
	}'
	;;
ttft)
	# Prompts of their own for each run (seeds 1000 apart), so that neither finds the
	# other's in the prefix cache; the order alternates between rounds.
	pct() { awk -F: -v k="$2" '$1 ~ k { gsub(/ /, "", $2); print $2 }' "$1"; }
	for r in 1 2; do
		order="router direct"
		[ $((r % 2)) = 0 ] && order="direct router"
		for via in $order; do
			url=http://127.0.0.1:$HP seed=$r
			[ $via = direct ] && url=http://127.0.0.1:$EP seed=$((1000 + r))
			bench "$url" --workload random --random-input-len 64 --random-output-len 4 --num-prompts 500 --max-concurrency 1 \
				--seed $seed >"$D/$via.$r.log" 2>&1
		done
		for p in "Median" "P90" "P99"; do
			a=$(pct "$D/router.$r.log" "^$p TTFT") b=$(pct "$D/direct.$r.log" "^$p TTFT")
			awk -v p="$p" -v a="$a" -v b="$b" -v r=$r 'BEGIN { printf "round %d, %s TTFT: router %.2f ms, direct %.2f ms, added %+.2f ms\n", r, p, a, b, a - b }'
		done
	done
	;;
*)
	echo "unknown mode $MODE: mooncake, small, idle or ttft" >&2
	exit 2
	;;
esac
