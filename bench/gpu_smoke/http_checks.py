"""HTTP checks against a running omni-serve; each appends rows (check, status, figures, notes,
tab-separated) to the smoke's rows.tsv.

  http_checks.py omni PORT ROWS           the embedded default: chat with an image in, 2 images
                                          out, speech out, that speech's transcription
  http_checks.py long PORT ROWS MODEL_DIR one prompt counted in tokens with the served model's
                                          tokenizer (--tokens, default 31,000: 4 chunks of 8192
                                          within a 32,768 context), 8 tokens out; the server's
                                          own count (usage.prompt_tokens) in the row
  http_checks.py a3 PORT ROWS             out-of-vocabulary stop_token_ids with min_tokens: a 400,
                                          and the next request and /health still 200 (review A3)
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import random
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from bench.omni_bench.workload import random_words


def call(base: str, path: str, body: dict[str, Any] | None = None, *, data: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 90) -> tuple[int, bytes, float]:  # fmt: skip
    headers = headers or {"content-type": "application/json"}
    req = urllib.request.Request(base + path, data if data is not None else json.dumps(body).encode(), headers)
    t = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read(), time.perf_counter() - t
    except urllib.error.HTTPError as e:
        return e.code, e.read(), time.perf_counter() - t
    except Exception as e:  # noqa: BLE001 - a refused or timed-out call is a row too
        return 0, str(e).encode(), time.perf_counter() - t


class Rows:
    def __init__(self, path: str) -> None:
        self.path = path

    def add(self, check: str, ok: bool, figures: str, notes: str = "") -> None:
        cells = [c.replace("\t", " ").replace("\n", " ").replace("|", "/") for c in (check, "ok" if ok else "FAIL", figures, notes[:160])]
        with open(self.path, "a") as f:
            f.write("\t".join(cells) + "\n")
        print(" | ".join(cells), flush=True)


def text(b: bytes) -> str:
    return b.decode(errors="replace")


def omni(base: str, model: str, rows: Rows) -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (640, 480), (200, 40, 40)).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]
    s, b, t = call(base, "/chat/completions", {"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": content}]})
    rows.add("omni: chat, an image in", s == 200, f"HTTP {s}, {t:.2f} s", "" if s == 200 else text(b))
    s, b, t = call(base, "/images/generations", {"model": model, "prompt": "a lighthouse at dusk", "size": "512x512",
                                                 "n": 2, "response_format": "b64_json", "seed": 7})  # fmt: skip
    n = len(json.loads(b).get("data", [])) if s == 200 else 0
    rows.add("omni: 2 images out, 512x512", s == 200 and n == 2, f"HTTP {s}, {t:.2f} s", f"{n} images" if s == 200 else text(b))
    s, wav, t = call(base, "/audio/speech", {"model": model, "voice": "alloy", "response_format": "wav", "seed": 1,
                                             "input": "Hello there, this is a GPU smoke test."})  # fmt: skip
    rows.add("omni: speech out (wav)", s == 200, f"HTTP {s}, {t:.2f} s", f"{len(wav)} bytes" if s == 200 else text(wav))
    if s != 200:
        rows.add("omni: transcription", False, "", "no speech to transcribe")
        return
    boundary = uuid.uuid4().hex
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"s.wav\"\r\n"
            f"Content-Type: audio/wav\r\n\r\n").encode() + wav + f"\r\n--{boundary}--\r\n".encode()  # fmt: skip
    s, b, t = call(base, "/audio/transcriptions", data=body, headers={"content-type": f"multipart/form-data; boundary={boundary}"})
    rows.add("omni: transcription of that speech", s == 200, f"HTTP {s}, {t:.2f} s", text(b))


def prompt_of(tokenizer_json: Path, tokens: int, seed: int = 0) -> tuple[str, int]:
    """Words (omni-bench's vocabulary) cut to at most `tokens` tokens of this tokenizer: the
    text and its count. Words are not tokens (the 100M checkpoint's tiny tokenizer makes about
    2.6 of each), so the count decides."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    words = random_words(random.Random(seed), tokens).split(" ")  # never fewer tokens than words
    lo, hi = 0, len(words)
    while lo < hi:  # the most words whose text stays within `tokens`
        mid = (lo + hi + 1) // 2
        if len(tok.encode(" ".join(words[:mid]), add_special_tokens=False).ids) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    out = " ".join(words[:lo])
    return out, len(tok.encode(out, add_special_tokens=False).ids)


def long_prompt(base: str, model: str, rows: Rows, model_dir: Path, tokens: int) -> None:
    context = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    prompt, n = prompt_of(model_dir / "tokenizer.json", tokens)
    s, b, t = call(base, "/completions", {"model": model, "prompt": prompt, "max_tokens": 8, "ignore_eos": True,
                                          "temperature": 0}, timeout=120)  # fmt: skip
    usage = json.loads(b).get("usage", {}) if s == 200 else {}
    rows.add(f"text: one {n:,}-token prompt (context {context:,}), 8 out", s == 200,
             f"HTTP {s}, {t:.2f} s", f"server counted {usage.get('prompt_tokens')} prompt tokens" if s == 200 else text(b))


def a3(base: str, port: str, model: str, rows: Rows) -> None:
    bad, bb, _ = call(base, "/completions", {"model": model, "prompt": "hi", "max_tokens": 8, "min_tokens": 4,
                                              "stop_token_ids": [99_999_999]})  # fmt: skip
    good, _, _ = call(base, "/completions", {"model": model, "prompt": "hi", "max_tokens": 8})
    try:
        health: int | str = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status
    except Exception as e:  # noqa: BLE001
        health = str(e)
    rows.add("A3: OOV stop_token_ids + min_tokens", bad == 400 and good == 200 and health == 200,
             f"bad {bad}, next {good}, /health {health}", text(bb))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("omni", "long", "a3"))
    p.add_argument("port")
    p.add_argument("rows")
    p.add_argument("model_dir", type=Path, nargs="?")
    p.add_argument("--tokens", type=int, default=31_000)
    a = p.parse_args()
    base = f"http://127.0.0.1:{a.port}/v1"
    model = json.load(urllib.request.urlopen(base + "/models", timeout=10))["data"][0]["id"]
    rows = Rows(a.rows)
    if a.what == "omni":
        omni(base, model, rows)
    elif a.what == "long":
        if a.model_dir is None:
            p.error("long needs MODEL_DIR")
        long_prompt(base, model, rows, a.model_dir, a.tokens)
    else:
        a3(base, a.port, model, rows)


if __name__ == "__main__":
    main()
