#!/usr/bin/env bash
# The lent GPU's smoke test (issue 22 point 7): under 8 minutes on one GPU, one table at the end.
#
#   bin/setup gpu        # or any .venv whose torch has CUDA; then, from the repo root:
#   bench/gpu_smoke.sh   # OUT=/tmp/gpu-smoke PORT=8100 PYTHON=.venv/bin/python to override
#
# Steps, each bounded by `timeout`; a failure is a row of the table, never the end of the run:
#   1. the CUDA-marked tests (pytest -m cuda, and the older CUDA tests by name);
#   2. bench/gpu_step_probe.py: a decode step's wall time against GPU-busy time, kernels per
#      step, the attention kernel, greedy and with every sampler feature;
#   3. a text server on a 100M random checkpoint: random and shared-prefix load, a 20k-token
#      prompt (bin/omni-bench), then the A3 probe (an out-of-vocabulary stop_token_ids with
#      min_tokens must be a 400, and the server must stay healthy);
#   4. the embedded default (every omni component) on cuda:0: chat with an image in, an image
#      out, speech out, a transcription of that speech.
# Peak GPU memory per process is sampled from nvidia-smi --query-compute-apps every second.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
OUT="${OUT:-/tmp/gpu-smoke}"
PORT="${PORT:-8100}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
rm -rf "$OUT" && mkdir -p "$OUT"
ROWS="$OUT/rows.tsv"
: > "$ROWS"
START=$(date +%s)

row() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$ROWS"; }  # check, status, figures, notes

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_smoke: no NVIDIA GPU here (nvidia-smi missing or shows none); nothing to run." >&2
    exit 2
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "gpu_smoke: $PY has no CUDA torch ($("$PY" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1))." >&2
    echo "Install a CUDA build first (e.g. pip install torch --index-url https://download.pytorch.org/whl/cu128), then bin/setup gpu." >&2
    exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

# ---- GPU memory per process, sampled while a phase runs --------------------------------------
watch_memory() {  # $1: file; runs until killed
    while true; do
        nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits >> "$1" 2>/dev/null
        sleep 1
    done
}
memory_rows() {  # $1: phase label, $2: file -> one row per process: its peak
    "$PY" - "$1" "$2" "$ROWS" <<'EOF'
import sys
label, path, rows = sys.argv[1:]
peak: dict[tuple[str, str], int] = {}
for line in open(path, errors="replace"):
    parts = [p.strip() for p in line.split(",")]
    if len(parts) == 3 and parts[2].isdigit():
        key = (parts[0], parts[1].rsplit("/", 1)[-1])
        peak[key] = max(peak.get(key, 0), int(parts[2]))
with open(rows, "a") as f:
    for (pid, name), mib in sorted(peak.items()):
        f.write(f"peak memory ({label})\tok\t{mib} MiB\tpid {pid} {name}\n")
    if not peak:
        f.write(f"peak memory ({label})\t-\t\tno process seen\n")
EOF
}

# ---- a server, started and stopped -------------------------------------------------------------
SERVER=""
start_server() {  # $1: log file, rest: omni-serve arguments; waits up to 240 s for /health
    local log="$1"; shift
    bin/omni-serve --port "$PORT" "$@" > "$log" 2>&1 &
    SERVER=$!
    for _ in $(seq 240); do
        if "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; then
            return 0
        fi
        kill -0 "$SERVER" 2>/dev/null || return 1
        sleep 1
    done
    return 1
}
stop_server() {
    [ -n "$SERVER" ] || return 0
    kill "$SERVER" 2>/dev/null
    timeout 30 tail --pid="$SERVER" -f /dev/null 2>/dev/null || kill -9 "$SERVER" 2>/dev/null
    SERVER=""
}
trap 'stop_server; [ -n "${WATCH:-}" ] && kill "$WATCH" 2>/dev/null' EXIT

# ---- 0. checkpoints (not timed as steps) ---------------------------------------------------------
Q100M="$OUT/q100m"
timeout 120 "$PY" bench/make_checkpoint.py --out "$Q100M" --size 100m --dtype bfloat16 > "$OUT/make_checkpoint.log" 2>&1 \
    && "$PY" - "$Q100M/config.json" <<'EOF'
import json, sys
p = sys.argv[1]; c = json.load(open(p)); c["max_position_embeddings"] = 32768  # the 20k prompt
json.dump(c, open(p, "w"), indent=2)
EOF
[ -f "$Q100M/config.json" ] || row "100M checkpoint" FAIL "" "see $OUT/make_checkpoint.log"

# ---- 1. CUDA-marked tests (~1 min) ------------------------------------------------------------
if "$PY" -c "import pytest" 2>/dev/null; then
    timeout 150 "$PY" -m pytest -q -rs -p no:cacheprovider -m cuda tests/gpu_workers tests/omni > "$OUT/pytest_cuda.log" 2>&1
    rc=$?
    timeout 90 "$PY" -m pytest -q -rs -p no:cacheprovider -k "cuda or gpu" \
        tests/gpu_workers/attention/test_backends.py tests/gpu_workers/attention/test_torch_sdpa.py \
        tests/gpu_workers/attention/test_flash_attn_backend.py tests/gpu_workers/models/test_flow_match.py >> "$OUT/pytest_cuda.log" 2>&1
    rc2=$?
    summary=$(grep -E "passed|failed|error" "$OUT/pytest_cuda.log" | tail -2 | tr '\n' ';')
    status=ok; { [ $rc -ne 0 ] && [ $rc -ne 5 ]; } && status=FAIL; { [ $rc2 -ne 0 ] && [ $rc2 -ne 5 ]; } && status=FAIL
    row "CUDA tests" "$status" "" "$summary"
else
    row "CUDA tests" SKIP "" "pytest is not installed (bin/setup gpu,test)"
fi

# ---- 2. decode step probe (~1 min) --------------------------------------------------------------
if [ -f "$Q100M/config.json" ]; then
    timeout 150 "$PY" bench/gpu_step_probe.py --model "$Q100M" --json "$OUT/probe.json" > "$OUT/probe.log" 2>&1
    if [ $? -eq 0 ]; then
        "$PY" - "$OUT/probe.json" "$ROWS" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1]))
with open(sys.argv[2], "a") as f:
    for kind in ("greedy", "every_sampler_feature"):
        r = p[kind]
        f.write(f"decode step, 64 seqs x 512 ({kind})\tok\twall {r['wall_ms_per_step']:.2f} ms, GPU busy "
                f"{r['gpu_busy_ms_per_step']:.2f} ms ({100 * r['busy_over_wall']:.0f} %)\t"
                f"{r['kernels_per_step']:.0f} kernels/step; attention {p['attention_backend']}\n")
EOF
    else
        row "decode step probe" FAIL "" "$(tail -1 "$OUT/probe.log")"
    fi
fi

# ---- 3. text server under load, then the A3 probe (~3 min) --------------------------------------
bench_row() {  # $1 label, $2 json
    "$PY" - "$1" "$2" "$ROWS" <<'EOF'
import json, sys
label, path, rows = sys.argv[1:]
s = json.load(open(path))["summary"]
ms = lambda x: "-" if x is None else f"{1e3 * x:.1f}"
with open(rows, "a") as f:
    status = "ok" if s["num_errors"] == 0 and not s["timed_out"] else "FAIL"
    f.write(f"{label}\t{status}\t{s['output_throughput']:.0f} tok/s out, {s['input_throughput']:.0f} tok/s in; "
            f"TTFT p50 {ms(s['ttft']['p50'])} ms (mean {ms(s['ttft']['mean'])}); TPOT p50 {ms(s['tpot']['p50'])} ms\t"
            f"{s['num_completed']}/{s['num_requests']} done, prefix hits {s['prefix_cache_hit_rate'] or 0:.0%}, "
            f"errors {dict(list(s['errors'].items())[:2])}\n")
EOF
}
if [ -f "$Q100M/config.json" ]; then
    WATCH_FILE="$OUT/mem_text.csv"; watch_memory "$WATCH_FILE" & WATCH=$!
    if start_server "$OUT/serve_text.log" --model "q100m=$Q100M" --device cuda:0 --gpu-memory-utilization 0.6 --max-num-seqs 128; then
        B=(bin/omni-bench --base-url "http://127.0.0.1:$PORT/v1" --no-progress --ignore-eos)
        timeout 100 "${B[@]}" --workload random --input-len 1024 --max-tokens 256 --concurrency 128 --num-requests 384 \
            --timeout 90 --out "$OUT/b_random.json" > "$OUT/b_random.log" 2>&1
        [ -f "$OUT/b_random.json" ] && bench_row "text: random 1024 in / 256 out, c=128" "$OUT/b_random.json" \
            || row "text: random" FAIL "" "$(tail -1 "$OUT/b_random.log")"
        timeout 70 "${B[@]}" --workload shared-prefix --prefix-len 4096 --num-groups 4 --questions-per-group 16 \
            --max-tokens 64 --concurrency 32 --timeout 60 --out "$OUT/b_prefix.json" > "$OUT/b_prefix.log" 2>&1
        [ -f "$OUT/b_prefix.json" ] && bench_row "text: shared prefix 4096, 4 x 16" "$OUT/b_prefix.json" \
            || row "text: shared prefix" FAIL "" "$(tail -1 "$OUT/b_prefix.log")"
        timeout 70 "${B[@]}" --workload random --input-len 20000 --max-tokens 8 --num-requests 2 --concurrency 1 \
            --timeout 60 --out "$OUT/b_long.json" > "$OUT/b_long.log" 2>&1
        [ -f "$OUT/b_long.json" ] && bench_row "text: 20k-word prompt, 8 out" "$OUT/b_long.json" \
            || row "text: 20k prompt" FAIL "" "$(tail -1 "$OUT/b_long.log")"
        timeout 30 "$PY" - "$PORT" "$ROWS" <<'EOF'
import json, sys, urllib.error, urllib.request
port, rows = sys.argv[1:]
base = f"http://127.0.0.1:{port}"
def post(body):
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(), {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.read()[:200]
    except urllib.error.HTTPError as e:
        return e.code, e.read()[:200]
bad, bad_body = post({"model": "q100m", "prompt": "hi", "max_tokens": 8, "min_tokens": 4, "stop_token_ids": [99999999]})
good, _ = post({"model": "q100m", "prompt": "hi", "max_tokens": 8})
try:
    health = urllib.request.urlopen(base + "/health", timeout=5).status
except Exception as e:  # noqa: BLE001
    health = str(e)
ok = bad == 400 and good == 200 and health == 200
with open(rows, "a") as f:
    f.write(f"A3 probe: OOV stop_token_ids + min_tokens\t{'ok' if ok else 'FAIL'}\tbad request {bad}, next request {good}, "
            f"/health {health}\t{bad_body.decode(errors='replace')[:90]}\n")
EOF
        [ $? -eq 0 ] || row "A3 probe" FAIL "" "probe script failed or timed out"
        kernel=$(grep -oiE "attention[^,;]*(flash|sdpa|paged|flashinfer|backend)[^,;]*" "$OUT/serve_text.log" | head -1)
        row "attention kernel (server log)" "${kernel:+ok}" "${kernel:-not logged}" ""
        grep -nE "Traceback|out of memory|device-side|CUDA error" "$OUT/serve_text.log" | head -3 > "$OUT/text_errors.txt"
        [ -s "$OUT/text_errors.txt" ] && row "text server log" FAIL "" "$(head -1 "$OUT/text_errors.txt" | cut -c1-120)"
    else
        row "text server start" FAIL "" "$(tail -1 "$OUT/serve_text.log" | cut -c1-120)"
    fi
    stop_server; kill "$WATCH" 2>/dev/null; WATCH=""
    memory_rows "text server" "$WATCH_FILE"
fi

# ---- 4. every omni component on one GPU (~2 min) ------------------------------------------------
WATCH_FILE="$OUT/mem_omni.csv"; watch_memory "$WATCH_FILE" & WATCH=$!
if start_server "$OUT/serve_omni.log" --device cuda:0; then
    timeout 200 "$PY" - "$PORT" "$ROWS" "$OUT" <<'EOF'
import base64, io, json, sys, time, urllib.error, urllib.request, uuid
port, rows, out = sys.argv[1:]
base = f"http://127.0.0.1:{port}/v1"
model = json.load(urllib.request.urlopen(base + "/models", timeout=10))["data"][0]["id"]

def call(path, body=None, *, data=None, headers=None, timeout=90):
    headers = headers or {"content-type": "application/json"}
    req = urllib.request.Request(base + path, data if data is not None else json.dumps(body).encode(), headers)
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), time.perf_counter() - t
    except urllib.error.HTTPError as e:
        return e.code, e.read(), time.perf_counter() - t
    except Exception as e:  # noqa: BLE001
        return 0, str(e).encode(), time.perf_counter() - t

def report(check, status, took, detail):
    with open(rows, "a") as f:
        f.write(f"{check}\t{'ok' if status == 200 else 'FAIL'}\tHTTP {status}, {took:.2f} s\t{detail[:100]}\n")

from PIL import Image
buf = io.BytesIO(); Image.new("RGB", (640, 480), (200, 40, 40)).save(buf, "PNG")
url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
s, b, t = call("/chat/completions", {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": [
    {"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]}]})
report("omni: chat with an image in", s, t, b.decode(errors="replace") if s != 200 else "")
s, b, t = call("/images/generations", {"model": model, "prompt": "a lighthouse at dusk", "size": "512x512", "n": 2,
                                       "response_format": "b64_json", "seed": 7})
n = len(json.loads(b).get("data", [])) if s == 200 else 0
report("omni: image out (2 x 512x512)", s, t, f"{n} images" if s == 200 else b.decode(errors="replace"))
s, wav, t = call("/audio/speech", {"model": model, "voice": "alloy", "input": "Hello there, this is a GPU smoke test.",
                                   "response_format": "wav", "seed": 1})
report("omni: speech out", s, t, f"{len(wav)} bytes of wav" if s == 200 else wav.decode(errors="replace"))
if s == 200:
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"s.wav\"\r\n"
            f"Content-Type: audio/wav\r\n\r\n").encode() + wav + f"\r\n--{boundary}--\r\n".encode()
    s, b, t = call("/audio/transcriptions", data=body, headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    report("omni: transcription of that speech", s, t, b.decode(errors="replace"))
else:
    report("omni: transcription", 0, 0.0, "skipped: no speech to transcribe")
EOF
    [ $? -eq 0 ] || row "omni requests" FAIL "" "request script failed or timed out"
    grep -nE "Traceback|out of memory|device-side|CUDA error" "$OUT/serve_omni.log" | head -3 > "$OUT/omni_errors.txt"
    [ -s "$OUT/omni_errors.txt" ] && row "omni server log" FAIL "" "$(head -1 "$OUT/omni_errors.txt" | cut -c1-120)"
else
    row "omni server start (embedded default, cuda:0)" FAIL "" "$(tail -1 "$OUT/serve_omni.log" | cut -c1-120)"
fi
stop_server; kill "$WATCH" 2>/dev/null; WATCH=""
memory_rows "omni server" "$WATCH_FILE"

# ---- the table -----------------------------------------------------------------------------------
echo
echo "GPU: $(cat "$OUT/gpu.txt" 2>/dev/null | head -1); $(( $(date +%s) - START )) s in all; logs in $OUT"
echo
"$PY" - "$ROWS" <<'EOF'
import sys
print("| check | status | figures | notes |")
print("|---|---|---|---|")
for line in open(sys.argv[1]):
    cells = (line.rstrip("\n").split("\t") + ["", "", "", ""])[:4]
    print("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
EOF
grep -q $'\tFAIL\t' "$ROWS" && exit 1
exit 0
