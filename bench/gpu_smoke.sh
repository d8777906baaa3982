#!/usr/bin/env bash
# The lent GPU's smoke test (issue 34 item 6): one device call on a bare, offline machine
# (nvidia-h100-x1 or nvidia-h200: torch 2.11.0+cu130, triton 3.6.0, transformers 5.17, nvcc
# 13.0, no registry), within SMOKE_BUDGET_S seconds (default 560, under the call's 600 s).
#
#   bench/gpu_smoke.sh --bundle            # here, once: .gpu/ (wheels + trimmed FlashInfer), its size
#   bench/gpu_smoke.sh --dry-run [--quick] # here, on a CPU: the checks below, last line the verdict
#   SMOKE_BUDGET_S=560 bash bench/gpu_smoke.sh   # there: the device tool's command, carry [".gpu"]
#
# It works in $SMOKE_WORK (/tmp/smoke; a rerun on the warm machine reuses its checkpoints) and
# leaves 5 files in $OUT (the folder that comes back): summary.md (the table), rows.tsv,
# results.json (every check's JSON), facts.txt (the machine), logs.tgz (each log's last 300 kB).
# Every phase runs under `timeout` against the one deadline, its cap read from
# bench/gpu_smoke/plan.py; a failed phase is a row, never the end.
#
# Phases, in order (SMOKE_PHASES narrows them for a rerun):
#   imports  the server and every runner import under the machine's torch (bench/gpu_smoke/imports.py)
#   fi       [background] FlashInfer 0.7.4 through our backend against paged_varlen_reference:
#            short rows (FA2 on sm90) and a long chunk (FA3) (fi_check.py)
#   ckpt     the 100M random checkpoint (bf16, 32,768 context) and the omni-tiny default
#   omni     [started in the background] the embedded default on cuda:0: chat with an image,
#            2 images, speech, its transcription (http_checks.py omni)
#   graph    the compiled decode step's CUDA graphs: the KV cache's copy measured over
#            DecodeGraph.warm_up, compiled against eager token for token, ms per step (graph_check.py)
#   pytest   the CUDA tests (-m cuda) of the files that have them, one run, a row per file
#   text     the 100M model served (auto attention, compiled decode as by default): random
#            and shared-prefix load, a prompt of ~31,000 counted tokens, the A3 probe
#   probe    bench/gpu_step_probe.py (eager decode: wall against GPU-busy), if time is left
# Knobs: SMOKE_STATIC=1 adds graph_check --static (the cache marked by hand, when DecodeGraph
# does not mark it itself); SMOKE_GRAPH_ATTENTION (torch_sdpa: no JIT in the graph check;
# flashinfer once its rows pass); SMOKE_TEXT_ATTENTION (auto; the FlashInfer rows may narrow it);
# SMOKE_LONG_TOKENS (31000).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
PY="${PYTHON:-python3}"
CUDA_TESTS() { grep -rlE "mark\.cuda|cuda\.is_available\(\)" tests --include='test_*.py' | sort; }

# ---- --bundle and --dry-run: on this machine, no GPU -------------------------------------------
if [ "${1:-}" = --bundle ]; then
    PYTHONPATH="$ROOT" exec "$PY" -m bench.gpu_smoke.bundle build
fi
if [ "${1:-}" = --dry-run ]; then
    quick=0; [ "${2:-}" = --quick ] && quick=1
    export PYTHONPATH="$ROOT"
    fail=0
    step() { echo "dry run: $*"; }
    if [ -d .gpu ] || [ "${SMOKE_BUILD:-0}" = 1 ]; then
        "$PY" -m bench.gpu_smoke.bundle build > /tmp/gpu_smoke_bundle.$$ 2>&1 || fail=1
        size=$(tail -1 /tmp/gpu_smoke_bundle.$$); rm -f /tmp/gpu_smoke_bundle.$$
    else
        size=$("$PY" -m bench.gpu_smoke.bundle size) || fail=1
    fi
    step "$size"
    plan=$("$PY" -m bench.gpu_smoke.plan check "${SMOKE_BUDGET_S:-560}") || fail=1
    echo "$plan"
    bash -n bench/gpu_smoke.sh || { step "bash -n bench/gpu_smoke.sh FAILED"; fail=1; }
    "$PY" -m py_compile bench/gpu_smoke/*.py || { step "py_compile FAILED"; fail=1; }
    site=$(mktemp -d)
    "$PY" -m bench.gpu_smoke.lent site "$site" || fail=1
    if PYTHONPATH="$site:$ROOT" "$PY" -m bench.gpu_smoke.imports > "$site/imports.log" 2>&1; then
        step "imports under the lent packages: $(head -1 "$site/imports.log")"
    else
        step "imports under the lent packages FAILED: $(grep FAILED "$site/imports.log" | head -3 | tr '\n' ' ')"; fail=1
    fi
    if [ $quick = 1 ]; then mapfile -t what < <(CUDA_TESTS); scope="the ${#what[@]} CUDA test files"
    else what=(tests); scope="tests/ whole"; fi
    PYTHONPATH="$site:$ROOT" "$PY" -m pytest --collect-only -q -m cuda -p no:cacheprovider "${what[@]}" > "$site/collect.log" 2>&1
    rc=$?
    collected=$(grep -E "tests? collected|no tests collected|errors? in" "$site/collect.log" | tail -1)
    # rc 5: nothing selected, no error
    if { [ $rc = 0 ] || [ $rc = 5 ]; } && ! grep -qE "^ERROR|errors? during collection" "$site/collect.log"; then
        step "pytest --collect-only -m cuda under the lent packages ($scope): $collected"
        coll="collect-only -m cuda under the lent packages: ${collected%% in *}, no errors ($scope)"
    else
        grep -E "^ERROR" "$site/collect.log" | head -5
        coll="collect-only -m cuda under the lent packages FAILED ($scope): $collected"; fail=1
    fi
    rm -rf "$site"
    echo "dry run $([ $fail = 0 ] && echo ok || echo FAILED): $size; $(echo "$plan" | tail -1); $coll"
    exit $fail
fi
[ $# = 0 ] || { sed -n 2,9p "$0"; exit 2; }

# ---- the run, on the lent machine ------------------------------------------------------------
T0=$(date +%s)
BUDGET=${SMOKE_BUDGET_S:-560}
DEADLINE=$((T0 + BUDGET))
PHASES=" ${SMOKE_PHASES:-imports fi ckpt omni graph pytest text probe} "
RET="${OUT:-/tmp/smoke-out}"   # what comes back: the 5 result files only
W="${SMOKE_WORK:-/tmp/smoke}"
mkdir -p "$RET" "$W/logs" "$W/json"
rm -f "$W"/json/* "$W"/logs/* "$W"/*.pid
ROWS="$W/rows.tsv"
: > "$ROWS"
eval "$(PYTHONPATH="$ROOT" "$PY" -m bench.gpu_smoke.plan shell)"
now() { echo $(($(date +%s) - T0)); }
left() { echo $((DEADLINE - $(date +%s))); }
on() { [[ "$PHASES" == *" $1 "* ]]; }
row() {  # check status figures notes: a line of rows.tsv, echoed
    local f=() x
    for x in "$1" "$2" "${3:-}" "${4:-}"; do x=${x//$'\n'/ }; x=${x//$'\t'/ }; f+=("${x//|//}"); done
    printf '%s\t%s\t%s\t%s\n' "${f[@]}" >> "$ROWS"
    echo "[$(now) s] ${f[0]} | ${f[1]} | ${f[2]} | ${f[3]}"
}
cap() {  # phase -> its timeout: its cap, or what is left before finishing, whichever is less
    local c="CAP_$1" l=$(($(left) - CAP_finish))
    local want=${!c}; ((l < want)) && want=$l; echo $((want < 1 ? 1 : want))   # timeout 0 would mean none
}
due() {  # phase [least seconds]: true when the phase may start, else a SKIP row
    local t; t=$(cap "$1"); ((t >= ${2:-5})) && return 0
    row "$1" SKIP "" "budget: $(left) s left at $(now) s"; return 1
}
status() { [ "$1" = 0 ] && echo ok || echo FAIL; }
healthy() { "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$1/health', timeout=2)" 2>/dev/null; }
wait_healthy() {  # port pid seconds
    local end=$(($(date +%s) + $3))
    while (($(date +%s) < end)); do
        healthy "$1" && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 2
    done
    return 1
}
stop() { [ -n "${1:-}" ] || return 0; kill "$1" 2>/dev/null; timeout 20 tail --pid="$1" -f /dev/null 2>/dev/null || kill -9 "$1" 2>/dev/null; }
errors_in() { grep -nE "Traceback|out of memory|device-side|CUDA error|illegal memory" "$1" 2>/dev/null | head -3 | cut -c1-160 | tr '\n' ' '; }
gpu_mem() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null | tr '\n' ';' | cut -c1-200; }
jget() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {'d': d}))" "$@" 2>/dev/null; }
bench_row() { "$PY" -m bench.gpu_smoke.report bench "$1" "$2" "$ROWS"; }  # label json
finish() {
    { echo "GPU: $(head -1 "$W/facts.txt" 2>/dev/null); $(now) s of the ${BUDGET} s budget"; echo
      echo "| check | status | figures | notes |"; echo "|---|---|---|---|"
      awk -F'\t' '{printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4}' "$ROWS"; echo; } > "$RET/summary.md"
    cp "$ROWS" "$RET/rows.tsv"; cp "$W/facts.txt" "$RET/facts.txt" 2>/dev/null
    "$PY" -m bench.gpu_smoke.report results "$W/json" "$RET/results.json"
    for f in "$W"/logs/*; do [ -f "$f" ] && tail -c 300000 "$f" > "$f.tail" && mv "$f.tail" "$f"; done
    tar -czf "$RET/logs.tgz" -C "$W" logs 2>/dev/null
    cat "$RET/summary.md"
}
stop_fi() { for p in $(cat "$W/fi.pid" 2>/dev/null); do kill "$p" 2>/dev/null; done; rm -f "$W/fi.pid"; }
trap 'exit 143' TERM
trap 'stop "${OMNI:-}"; stop "${TEXT:-}"; stop_fi; finish' EXIT

# ---- 0. the carried packages, and the machine's facts ------------------------------------------
SITE="$W/site"
CARRIED="${SMOKE_CARRIED:-.gpu}"   # another folder (or none) for a flow check off the lent machine
if [ ! -d "$CARRIED/whl" ]; then
    row "carried files" FAIL "" "no $CARRIED/whl here: bench/gpu_smoke.sh --bundle, then carry [\".gpu\"]"
else
    mkdir -p "$SITE"
    # pip where the image has it; else a wheel is a zip of the site's files (none of these has .data)
    timeout "$(cap setup)" "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$CARRIED"/whl/*.whl \
        > "$W/logs/setup.log" 2>&1 \
        || "$PY" -c "import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]" "$SITE" "$CARRIED"/whl/*.whl \
            >> "$W/logs/setup.log" 2>&1 \
        || row "install the carried wheels" FAIL "" "$(tail -1 "$W/logs/setup.log")"
    # tar's -J needs the xz program; Python's tarfile reads xz itself
    [ -d "$SITE/flashinfer" ] || timeout "$(cap setup)" tar -xJf "$CARRIED"/flashinfer-*-trim.tar.xz -C "$SITE" >> "$W/logs/setup.log" 2>&1 \
        || "$PY" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$CARRIED"/flashinfer-*-trim.tar.xz "$SITE" \
            >> "$W/logs/setup.log" 2>&1 \
        || row "unpack FlashInfer" FAIL "" "$(tail -1 "$W/logs/setup.log")"
fi
export PYTHONPATH="$SITE:$ROOT" PYTHONUNBUFFERED=1
export OMNI_PYTHON="$(command -v "$PY")"   # bin/omni-serve and bin/omni-bench: the same interpreter
[ -d /usr/local/cuda/bin ] && export PATH="/usr/local/cuda/bin:$PATH"
export MAX_JOBS="${MAX_JOBS:-8}"   # FlashInfer's ninja -j per build: FA2 and FA3 build at once
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU: nvidia-smi missing or shows none"
  "$PY" -c "import sys, torch, triton, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  nvcc --version 2>&1 | tail -2; echo "ninja $(command -v ninja), gcc $(gcc -dumpversion 2>/dev/null), $(nproc) cores"
  free -g | sed -n 2p; df -h /tmp | tail -1; git -C "$ROOT" log -1 --format='tree %h %cI' 2>/dev/null; } > "$W/facts.txt" 2>&1
row "machine" ok "$(head -1 "$W/facts.txt")" "$(sed -n 2p "$W/facts.txt")"

# ---- 1. imports under this torch ----------------------------------------------------------------
if on imports && due imports; then
    timeout "$(cap imports)" "$PY" -m bench.gpu_smoke.imports > "$W/logs/imports.log" 2>&1
    rc=$?
    row "imports (server, every runner, carried wheels)" "$(status $rc)" "$(head -1 "$W/logs/imports.log" | cut -c1-120)" \
        "$(sed -n 2p "$W/logs/imports.log"; grep -m2 FAILED "$W/logs/imports.log")"
fi

# ---- 2. FlashInfer through our backend, in the background -----------------------------------------
FI=""
if on fi; then
    (
        timeout "$CAP_fi" "$PY" -m bench.gpu_smoke.fi_check --rows short --json "$W/json/fi_short.json" > "$W/logs/fi_short.log" 2>&1 &
        echo $! >> "$W/fi.pid"
        timeout "$CAP_fi" "$PY" -m bench.gpu_smoke.fi_check --rows long --json "$W/json/fi_long.json" > "$W/logs/fi_long.log" 2>&1 &
        echo $! >> "$W/fi.pid"
        wait
    ) &
    FI=$!
fi

# ---- 3. checkpoints ----------------------------------------------------------------------------
Q="$W/q100m"
if { on ckpt || on text || on graph || on probe; } && [ ! -f "$Q/.smoke-ready" ] && due ckpt; then
    t=$(cap ckpt)
    ( timeout "$t" "$PY" bench/make_checkpoint.py --out "$Q" --size 100m --dtype bfloat16 > "$W/logs/ckpt.log" 2>&1 \
      && "$PY" -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c['max_position_embeddings']=32768; json.dump(c, open(p,'w'), indent=2)" "$Q/config.json" \
      && touch "$Q/.smoke-ready" ) &
    c1=$!
    timeout "$t" "$PY" -m gpu_workers.tiny.published --print-default-dir > "$W/logs/omni_ckpt.log" 2>&1 &
    c2=$!
    wait $c1; r1=$?; wait $c2; r2=$?
    row "checkpoints (q100m bf16 32k, omni-tiny)" "$( ((r1 + r2 == 0)) && echo ok || echo FAIL)" "ready at $(now) s" \
        "$(tail -1 "$W/logs/ckpt.log" | cut -c1-100)"
fi

# ---- 4. the embedded default starts in the background ----------------------------------------------
OMNI=""
if on omni; then
    bin/omni-serve default --device cuda:0 --port 8101 --enforce-eager --gpu-memory-utilization 0.30 > "$W/logs/serve_omni.log" 2>&1 &
    OMNI=$!
    OMNI_T=$(date +%s)
fi

# ---- 5. the compiled decode step's CUDA graphs (while the omni server starts) ---------------------
if on graph && [ -f "$Q/.smoke-ready" ] && due graph 30; then
    static=(); [ "${SMOKE_STATIC:-0}" = 1 ] && static=(--static)
    timeout "$(cap graph)" "$PY" -m bench.gpu_smoke.graph_check --model "$Q" --json "$W/json/graph.json" \
        --attention-backend "${SMOKE_GRAPH_ATTENTION:-torch_sdpa}" "${static[@]}" > "$W/logs/graph.log" 2>&1
    rc=$?
    row "compiled decode: CUDA graphs (KV copy, parity, ms/step)" "$(status $rc)" \
        "$(grep '^SUMMARY:' "$W/logs/graph.log" | tail -1 | cut -c10-400)" "$([ $rc = 124 ] && echo "timed out at $(now) s")"
elif on graph; then
    [ -f "$Q/.smoke-ready" ] || row "compiled decode: CUDA graphs" SKIP "" "no q100m checkpoint"
fi

# ---- 6. the embedded default's requests ---------------------------------------------------------
if [ -n "$OMNI" ]; then
    if due omni 20 && wait_healthy 8101 "$OMNI" "$(cap omni)"; then
        row "omni server start (cuda:0, eager, 0.30 of the GPU)" ok "healthy after $(($(date +%s) - OMNI_T)) s" "$(gpu_mem)"
        timeout "$(cap omni)" "$PY" -m bench.gpu_smoke.http_checks omni 8101 "$ROWS" > "$W/logs/omni_requests.log" 2>&1 \
            || row "omni requests" FAIL "" "$(tail -1 "$W/logs/omni_requests.log" | cut -c1-160)"
    else
        row "omni server start (cuda:0, eager, 0.30 of the GPU)" FAIL "not healthy after $(($(date +%s) - OMNI_T)) s" \
            "$(tail -1 "$W/logs/serve_omni.log" | cut -c1-160)"
    fi
    e=$(errors_in "$W/logs/serve_omni.log"); [ -n "$e" ] && row "omni server log" FAIL "" "$e"
    stop "$OMNI"; OMNI=""
fi

# ---- 7. the CUDA tests: one run, a row per file -------------------------------------------------
if on pytest && due pytest 20; then
    mapfile -t files < <(CUDA_TESTS)
    timeout "$(cap pytest)" "$PY" -m pytest -q -rfEs -p no:cacheprovider --continue-on-collection-errors \
        -o junit_family=xunit2 --junitxml "$W/logs/pytest.xml" -m cuda "${files[@]}" > "$W/logs/pytest.log" 2>&1
    rc=$?
    "$PY" -m bench.gpu_smoke.report pytest "$W/logs/pytest.xml" "$ROWS" "${files[@]}" \
        || row "CUDA tests" FAIL "exit $rc" "$(tail -1 "$W/logs/pytest.log" | cut -c1-160)"
fi

# ---- 8. FlashInfer's rows; its builds stop when the text phase is due --------------------------
ATT="${SMOKE_TEXT_ATTENTION:-auto}"
EXTRA=()
if [ -n "$FI" ]; then
    # the builds have until the text phase is due (they started at ~30 s: ~300 s on the plan's caps)
    while kill -0 "$FI" 2>/dev/null && (($(left) > CAP_text + CAP_finish)); do sleep 2; done
    kill -0 "$FI" 2>/dev/null && row "FlashInfer JIT" FAIL "unfinished at $(now) s" "stopped to leave the text phase its time"
    stop_fi; FI=""
    for m in short long; do
        j="$W/json/fi_$m.json"
        if [ -f "$j" ]; then
            row "FlashInferBackend, $m rows, against the reference" "$([ "$(jget "$j" "d['ok']")" = True ] && echo ok || echo FAIL)" \
                "$(jget "$j" "f\"{d.get('kernel')}, import {d.get('import_s')} s, JIT+first {d.get('first_forward_s')} s, {d.get('forward_ms')} ms/call, err {d.get('max_abs_err')}\"")" \
                "$(jget "$j" "d.get('error', '')[:160]")"
        else
            row "FlashInferBackend, $m rows" FAIL "no result" "$(tail -1 "$W/logs/fi_$m.log" | cut -c1-160)"
        fi
    done
    fi_ok() { [ "$(jget "$W/json/fi_$1.json" "d['ok']")" = True ]; }
    if [ -z "${SMOKE_TEXT_ATTENTION:-}" ]; then
        if fi_ok short && ! fi_ok long; then
            # FA3 (chunks over 64 rows on sm90) failed: chunks of 64 keep FlashInfer on FA2
            ATT=flashinfer; EXTRA=(--max-num-batched-tokens 64)
        elif ! fi_ok short; then
            ATT=torch_sdpa
        fi
    fi
fi

# ---- 9. the text server: compiled decode as by default ------------------------------------------
TEXT=""
if on text && [ -f "$Q/.smoke-ready" ] && due text 100; then
    t=$(date +%s)
    # 32 sequences: buckets 1 to 32, 12 CUDA-graph recordings at start (64 would add 2 more, and time)
    bin/omni-serve --model "q100m=$Q" --device cuda:0 --gpu-memory-utilization 0.6 --max-num-seqs 32 --port 8102 \
        --attention-backend "$ATT" "${EXTRA[@]}" > "$W/logs/serve_text.log" 2>&1 &
    TEXT=$!
    if wait_healthy 8102 "$TEXT" $(($(cap text) - 50)); then   # the loads below take ~40 s
        row "text server start (attention $ATT ${EXTRA[*]})" ok "healthy after $(($(date +%s) - t)) s" "$(gpu_mem)"
        B=(bin/omni-bench --base-url http://127.0.0.1:8102/v1 --no-progress --ignore-eos)
        timeout "$(cap text)" "${B[@]}" --workload random --input-len 256 --max-tokens 128 --concurrency 32 --num-requests 96 \
            --timeout 30 --out "$W/json/b_random.json" > "$W/logs/b_random.log" 2>&1
        [ -f "$W/json/b_random.json" ] && bench_row "text: random 256 words (~670 tokens) / 128 out, c=32" "$W/json/b_random.json" \
            || row "text: random" FAIL "" "$(tail -1 "$W/logs/b_random.log" | cut -c1-160)"
        timeout "$(cap text)" "${B[@]}" --workload shared-prefix --prefix-len 1500 --num-groups 2 --questions-per-group 8 \
            --max-tokens 32 --concurrency 16 --timeout 20 --out "$W/json/b_prefix.json" > "$W/logs/b_prefix.log" 2>&1
        [ -f "$W/json/b_prefix.json" ] && bench_row "text: shared prefix 1500 words, 2 x 8" "$W/json/b_prefix.json" \
            || row "text: shared prefix" FAIL "" "$(tail -1 "$W/logs/b_prefix.log" | cut -c1-160)"
        timeout "$(cap text)" "$PY" -m bench.gpu_smoke.http_checks long 8102 "$ROWS" "$Q" --tokens "${SMOKE_LONG_TOKENS:-31000}" \
            > "$W/logs/long.log" 2>&1 || row "text: long prompt" FAIL "" "$(tail -1 "$W/logs/long.log" | cut -c1-160)"
        timeout 20 "$PY" -m bench.gpu_smoke.http_checks a3 8102 "$ROWS" > "$W/logs/a3.log" 2>&1 \
            || row "A3 probe" FAIL "" "$(tail -1 "$W/logs/a3.log" | cut -c1-160)"
    else
        row "text server start (attention $ATT ${EXTRA[*]})" FAIL "not healthy after $(($(date +%s) - t)) s" \
            "$(tail -1 "$W/logs/serve_text.log" | cut -c1-160)"
    fi
    row "text server: attention, KV cache, compiled step (its log)" "-" \
        "$(grep -oE "attention backend [A-Za-z]+[^;]{0,60}|KV cache: .{0,120}" "$W/logs/serve_text.log" | head -2 | tr '\n' ';' | cut -c1-220)" \
        "$(grep -oE "compiled decode step (ready in .{0,80}|is unavailable.{0,110})" "$W/logs/serve_text.log" | head -1)"
    e=$(errors_in "$W/logs/serve_text.log"); [ -n "$e" ] && row "text server log" FAIL "" "$e"
    stop "$TEXT"; TEXT=""
elif on text && [ ! -f "$Q/.smoke-ready" ]; then
    row "text server" SKIP "" "no q100m checkpoint"
fi

# ---- 10. the eager decode step's profile, when its time is left ------------------------------------
if on probe && [ -f "$Q/.smoke-ready" ] && (($(left) - CAP_finish >= CAP_probe)); then
    ctx=512; [ ${#EXTRA[@]} -gt 0 ] && ctx=64   # FA3 unbuilt: the probe's prefill rows stay on FA2
    timeout "$(cap probe)" "$PY" bench/gpu_step_probe.py --model "$Q" --attention-backend "$ATT" --context $ctx --steps 8 \
        --warmup 2 --json "$W/json/probe.json" > "$W/logs/probe.log" 2>&1
    [ -f "$W/json/probe.json" ] && row "decode step probe (eager, 64 x $ctx, $ATT)" ok \
        "$(jget "$W/json/probe.json" "f\"greedy {d['greedy']['wall_ms_per_step']:.2f} ms wall, {100*d['greedy']['busy_over_wall']:.0f}% busy, {d['greedy']['kernels_per_step']:.0f} kernels; every feature {d['every_sampler_feature']['wall_ms_per_step']:.2f} ms\"")" \
        || row "decode step probe" FAIL "" "$(tail -1 "$W/logs/probe.log" | cut -c1-160)"
elif on probe; then
    row "decode step probe" SKIP "" "$(left) s left at $(now) s"
fi

grep -q $'\tFAIL\t' "$ROWS" && exit 1
exit 0
