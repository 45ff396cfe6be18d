#!/usr/bin/env bash
# The GPU benches of docs/gpu.md ("What the next GPU session should run"), prepared for a lent machine: each check
# runs under its own time limit, on a GPU cleared of leftover processes first, and writes its log where the device
# tool brings files back ($OUT). From the repository root on the device machine:
#
#   bash bench/gpu_checks.sh step kv        # items 5 and 3: at most 6.5 minutes together
#   bash bench/gpu_checks.sh rollout512     # item 2: a call of its own (up to 9 minutes)
#   bash bench/gpu_checks.sh update         # item 1: a call of its own (medians, then a profiled run of ours and plain)
#   bash bench/gpu_checks.sh orphans        # a bench killed mid-search leaves no engine (about 2 minutes)
#
# Wheels under .whl/ (transformers, deepspeed and its needs; docs/gpu.md) are installed to /tmp/site first when
# present (WHEELS=0: not). DEVICE (default cuda:0) and MODEL (default Qwen3-1.7B; empty: the benches' small model)
# override the target, so `WHEELS=0 DEVICE=cpu MODEL= ROWS=4 bash bench/gpu_checks.sh step` runs a check anywhere.
set -uo pipefail

OUT=${OUT:-/tmp/mars2-gpu}
DEVICE=${DEVICE-cuda:0}
MODEL=${MODEL-Qwen3-1.7B}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ "${WHEELS:-1}" = 1 ] && compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "the wheels in .whl/ did not install" >&2; exit 1; }
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

clear_gpu() {
    # by pid, from the driver: a name pattern (pkill -f) would also match this script's own command line
    if command -v nvidia-smi > /dev/null; then
        nvidia-smi --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9
        sleep 2
        nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
    fi
}

model_args() { [ -n "$MODEL" ] && echo "--model $MODEL"; }

check() {  # check NAME LIMIT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    clear_gpu
    echo "== $name (limit ${limit} s): $*"
    local t0=$SECONDS
    timeout --kill-after=20 "$limit" "$@" 2>&1 | grep -v -e Warning -e USDT | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/$name.log"
    [ "$rc" -eq 0 ] || status=$rc
    last_rc=$rc
}

status=0 last_rc=0  # the last failed check's exit status; the last check's

orphans() {  # a rollout bench killed by timeout mid-search must leave no engine process (docs/gpu.md, 3b)
    local after=$1 left="" before=$status running
    # the engines alive 5 s before the kill: a check where none had started yet would prove nothing
    (sleep $((after - 5)); pgrep -f "[e]ngine_server" | wc -l > "$OUT/orphans.running") &
    check orphans "$after" python3 bench/rollout.py --device "$DEVICE" $(model_args) --repeats 1 --skip-wave
    wait
    status=$before  # its timeout is the point
    if [ "$last_rc" -ne 124 ]; then
        echo "== orphans: the bench was not killed (exit $last_rc): set ORPHAN_AFTER lower" | tee -a "$OUT/orphans.log"
        status=1
        return
    fi
    running=$(cat "$OUT/orphans.running" 2>/dev/null || echo 0)
    echo "== orphans: $running engine process(es) running 5 s before the kill" | tee -a "$OUT/orphans.log"
    if [ "$running" -eq 0 ]; then
        echo "== orphans: no engine had started: set ORPHAN_AFTER higher" | tee -a "$OUT/orphans.log"
        status=1
        return
    fi
    for _ in $(seq 1 45); do
        left=$(pgrep -f "[e]ngine_server" | tr '\n' ' ')
        [ -z "$left" ] && break
        sleep 1
    done
    if [ -n "$left" ]; then
        echo "== orphans: engines still running 45 s after the bench was killed: $left" | tee -a "$OUT/orphans.log"
        for pid in $left; do grep -H -e State -e PPid "/proc/$pid/status"; done 2>&1 | tee -a "$OUT/orphans.log"
        status=1
    else
        echo "== orphans: no engine left" | tee -a "$OUT/orphans.log"
    fi
}

for item in "${@:-step kv}"; do
    for name in $item; do
        case $name in
            step) check step 150 python3 bench/engine_step.py --device "$DEVICE" $(model_args) \
                      --rows "${ROWS:-64}" --prompt-tokens 512 --new-tokens 32 ;;
            kv) check kv 240 python3 bench/kv_cache.py --device "${DEVICE%%:*}" --dtype bfloat16 $(model_args) \
                    --layers 28 --rows 16 --widths 1024,4096,8192 --repeats 1 ;;
            rollout128) check rollout128 300 python3 bench/rollout.py --device "$DEVICE" $(model_args) \
                            --expansions-per-wave 1 --repeats 1 --skip-wave ;;
            rollout512) check rollout512 540 python3 bench/rollout.py --device "$DEVICE" $(model_args) \
                            --expansions-per-wave 1 --repeats 1 --skip-wave --problems 512 ;;
            update) TMPDIR=/dev/shm check update "${UPDATE_LIMIT:-540}" python3 bench/gpu_update.py \
                        --repeats "${REPEATS:-3}" --variants "${VARIANTS:-ours,plain,plain_chunked}" \
                        --trace "${TRACE-ours,plain}" --skip-save $(model_args) --device "$DEVICE" ${UPDATE_ARGS:-} ;;
            orphans) orphans "${ORPHAN_AFTER:-90}" ;;
            *) echo "unknown check $name (step, kv, rollout128, rollout512, update, orphans)" >&2; exit 2 ;;
        esac
    done
done
clear_gpu
exit $status
