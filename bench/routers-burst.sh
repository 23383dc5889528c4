#!/usr/bin/env bash
# bench/routers-burst.sh: two live tandem-routers in front of the same sim replicas, and a
# burst of requests sent to both at once: how many land on one worker (docs/routing-study.md,
# "Two routers in a burst").
#
#   bench/routers-burst.sh BIN [REPLICAS] [BURST] [ROUNDS]   # defaults 100, 48, 3
#
# BIN holds tandem and tandem-router (go build -o BIN ./cmd/tandem ./cmd/tandem-router).
# Starts router A, copies its state directory for router B (one cluster CA and token), then
# one `tandem serve --backend sim --sim-profile gpu --replicas REPLICAS` that joins both.
# Each round sends BURST completions at once, alternately to A and B (ONE=1: all to A),
# each 192 random token ids of its own (nobody holds them: every idle worker ties, as in
# router.TestBurstTwoRouters), MAX_TOKENS (default 256) long with ignore_eos (so that all
# run at once: about 2 s), and counts the requests per worker from the X-Tandem-Worker
# header. Prints, per round, the workers used and the most requests on one. Rounds are 3 s
# apart, so that each starts on idle workers. DEBUG=1 prints an answer and the decisions.
set -euo pipefail
BIN=$(cd "$1" && pwd)
REPLICAS=${2:-100}
BURST=${3:-48}
ROUNDS=${4:-3}
D=$(mktemp -d)
# shellcheck source=bench/live.sh
. "$(dirname "$0")/live.sh"
tok=$LIVE_TOKEN
port() { echo $((18000 + RANDOM % 4000)); }
HA=$(port) OA=$(port) HB=$(port) OB=$(port) EP=$(port)
"$BIN/tandem-router" --port "$HA" --orpc-port "$OA" --state-dir "$D/a" --join-token $tok --log-level warn >"$D/a.log" 2>&1 &
PA=$!
trap 'kill $PA ${PB:-} ${PE:-} 2>/dev/null || true; wait 2>/dev/null || true' EXIT
for _ in $(seq 1 40); do [ -s "$D/a/ca.crt" ] && break; sleep 0.25; done
sleep 0.5
cp -r "$D/a" "$D/b"
"$BIN/tandem-router" --port "$HB" --orpc-port "$OB" --state-dir "$D/b" --join-token $tok --log-level warn >"$D/b.log" 2>&1 &
PB=$!
sleep 1
"$BIN/tandem" serve --backend sim --replicas "$REPLICAS" --sim-profile gpu --port "$EP" --orpc-port 0 \
	--join "127.0.0.1:$OA" --join "127.0.0.1:$OB" --join-token $tok --state-dir "$D/engine" --log-level warn >"$D/engine.log" 2>&1 &
PE=$!
for _ in $(seq 1 240); do
	[ "$(joined "$HA")" -ge "$REPLICAS" ] && [ "$(joined "$HB")" -ge "$REPLICAS" ] && break
	sleep 0.5
done
sleep 2
wait_curls() {
	local w
	w=$(jobs -p | grep -v -e "^$PA\$" -e "^$PB\$" -e "^$PE\$" || true)
	# shellcheck disable=SC2086
	[ -z "$w" ] || wait $w
}
share() { curl -s "localhost:$1/metrics" | awk '/^tandem_router:share /{s=$2} /^tandem_router:shares /{n=$2} END {print s+0 " of " n+0}'; }
echo "shares: A $(share "$HA"), B $(share "$HB")"
model=$(curl -s "localhost:$HA/v1/models" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p' | head -1)
# ids prints n token ids from a (the demo model's vocabulary is 260 tokens).
ids() { awk -v a="$1" -v n="$2" 'BEGIN { srand(a); for (k = 0; k < n; k++) printf "%s%d", (k ? "," : ""), 3 + int(rand() * 250) }'; }
for r in $(seq 1 "$ROUNDS"); do
	rm -f "$D"/h.*
	t0=$(date +%s%N)
	for i in $(seq 1 "$BURST"); do
		p=$HA
		[ $((i % 2)) = 0 ] && [ -z "${ONE:-}" ] && p=$HB
		curl -s -D "$D/h.$i" "localhost:$p/v1/completions" -H 'Content-Type: application/json' \
			-d "{\"model\":\"$model\",\"prompt\":[$(ids $((1000 * r + 7 * i + 1)) 192)],\"max_tokens\":${MAX_TOKENS:-256},\"ignore_eos\":true}" >"$D/b.$i" &
	done
	t1=$(date +%s%N)
	wait_curls
	t2=$(date +%s%N)
	[ -z "${DEBUG:-}" ] || { head -c 300 "$D/b.1"; echo; }
	grep -hi '^x-tandem-worker:' "$D"/h.* | tr -d '\r' | awk -v r="$r" -v n="$BURST" -v sent=$(((t1 - t0) / 1000000)) -v took=$(((t2 - t0) / 1000000)) '
		{ c[$2]++; t++ }
		END { m = 0; for (w in c) { u++; if (c[w] > m) m = c[w] }
		      printf "round %d: %d of %d requests answered, %d workers used, at most %d on one (sent in %d ms, all answered in %d ms)\n", r, t, n, u, m, sent, took }'
	[ -z "${DEBUG:-}" ] || curl -s "localhost:$HA/metrics" | grep -E "^tandem_router:.*(decision|reason|rejected)" | head -20
	sleep 3
done
