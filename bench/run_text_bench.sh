#!/usr/bin/env bash
# Wrapper: run the text-serving benchmark with the repo venv. All flags go to run_text_bench.py.
#   bench/run_text_bench.sh                                  # full: 64 req, c=32, 128 tokens, ~100M qwen2
#   bench/run_text_bench.sh --size tiny -n 4 -c 4 -m 8       # smoke test
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
exec "$PY" bench/run_text_bench.py "$@"
