#!/usr/bin/env bash
# bench/gpu.sh: the Vulkan backend's speed on a GPU machine, in a few minutes:
# pp512, tg64 and batch16 tokens per second (tandem bench-engine, llama-bench's
# tests) for random-weight models of the Qwen2.5-0.5B and Llama-3.2-1B shapes at
# Q8_0 and F16, each with the host's time per step and how many steps were
# replays of a recorded command buffer.
#
#   bench/gpu.sh                 # the first GPU (tandem devices lists them)
#   DEVICE=vulkan:1 bench/gpu.sh # another device
#   MODELS=/path bench/gpu.sh    # keep the generated models there (≈ 5 GB)
#   SMOKE=1 bench/gpu.sh         # narrow models, short tests: checks the script (lavapipe will do)
#
# Needs Go and the GPU's Vulkan driver (NVIDIA's, Mesa's RADV or ANV); on a
# machine with only lavapipe it runs too, slowly, and measures nothing useful.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin"
DEVICE=${DEVICE:-vulkan}
MODELS=${MODELS:-$(mktemp -d)}
REPS=${REPS:-3}
P=512 N=64 GEN=()
if [ -n "${SMOKE:-}" ]; then
	P=32 N=8 REPS=1 GEN=(--embd 128 --heads 2 --kv-heads 1 --head-dim 64 --ffn 256 --vocab-size 1024)
fi
mkdir -p "$MODELS"
go build -o "$MODELS/tandem" ./cmd/tandem
"$MODELS/tandem" devices
for preset in qwen2.5-0.5b llama3.2-1b; do
	for type in q8_0 f16; do
		f="$MODELS/$preset-$type${SMOKE:+-smoke}.gguf"
		[ -s "$f" ] || "$MODELS/tandem" gen-model --preset "$preset" --type "$type" "${GEN[@]}" --out "$f"
		echo "== $preset $type on $DEVICE"
		"$MODELS/tandem" bench-engine --model "$f" --device "$DEVICE" -p "$P" -n "$N" --batch 16 -r "$REPS"
		"$MODELS/tandem" bench-engine --model "$f" --device "$DEVICE" -p 0 -n "$N" --batch 16 -r 1 --replay=false |
			sed -n "s/^\(tg$N\|batch16\):/without replay, \1:/p"
	done
done
