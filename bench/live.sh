# bench/live.sh, sourced by bench/routing-live.sh, bench/router-cpu.sh and
# bench/routers-burst.sh: a live
# deployment of one tandem-router and one tandem serve process of sim replicas joined to
# it, both from $BIN, on random ports, with the router's CPU time to read.
#
#   start_live DIR REPLICAS TRIES [ROUTER FLAG ...]
#
# starts them with their state and logs in DIR (router.log, engine.log), the router with
# the flags given and then ROUTER_ARGS, the engine with ENGINE_ARGS last, and waits for REPLICAS workers to join (TRIES
# half-seconds at most) and 2 s more. It sets HP (the router's HTTP port), EP (the
# engine's), RPID and EPID, and kills both on exit.
# LIVE_TOKEN is the join token of the deployments these scripts start.
LIVE_TOKEN=abcdef.0123456789abcdef

# joined is how many workers the router whose HTTP port is $1 has.
joined() { curl -s "localhost:$1/metrics" | grep -c '^tandem_router:worker_info' || true; }

start_live() {
	local dir=$1 replicas=$2 tries=$3
	shift 3
	local tok=$LIVE_TOKEN
	HP=$((18000 + RANDOM % 1000)) OP=$((19000 + RANDOM % 1000)) EP=$((20000 + RANDOM % 1000))
	# shellcheck disable=SC2086
	"$BIN/tandem-router" --port $HP --orpc-port $OP --state-dir "$dir/router" --join-token $tok "$@" \
		--log-level warn ${ROUTER_ARGS:-} >"$dir/router.log" 2>&1 &
	RPID=$!
	sleep 1
	# shellcheck disable=SC2086
	"$BIN/tandem" serve --backend sim --replicas "$replicas" --sim-profile gpu --kv-cache-memory 896MiB \
		--max-model-len 131072 --max-seqs 256 --max-batch-tokens 8192 --port $EP --orpc-port 0 \
		--join 127.0.0.1:$OP --join-token $tok --state-dir "$dir/engine" --log-level warn ${ENGINE_ARGS:-} >"$dir/engine.log" 2>&1 &
	EPID=$!
	trap 'kill $EPID $RPID 2>/dev/null || true; wait 2>/dev/null || true' EXIT
	for _ in $(seq 1 "$tries"); do
		[ "$(joined $HP)" -ge "$replicas" ] && break
		sleep 0.5
	done
	sleep 2
}

# router_cpu is the router's CPU time so far (user and system), in clock ticks.
router_cpu() { awk '{print $14 + $15}' "/proc/$RPID/stat"; }
