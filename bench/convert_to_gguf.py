#!/usr/bin/env python3
"""Convert the benchmark's qwen2 checkpoint to GGUF with llama.cpp's own converter (issue 23).

    .venv/bin/python bench/convert_to_gguf.py                         # 100m: f32, bf16, q8_0
    .venv/bin/python bench/convert_to_gguf.py --size tiny --outtypes f32

The converter is `convert_hf_to_gguf.py` of the llama.cpp tree that bench/build_llama_cpp.sh
unpacks (the pinned llama-cpp-python sdist), run with that tree's own `gguf-py`, so the file
is the one that llama-server of the same source expects. It makes the checkpoint first
(bench/make_checkpoint.py) and writes bench/.cache/qwen2-<size>-<outtype>.gguf; a file newer
than the checkpoint's weights is reused.

The converter needs torch, transformers, numpy (the project's) and `sentencepiece` (imported
before it finds that the checkpoint has no tokenizer.model, whereupon it reads tokenizer.json).

One adaptation: llama.cpp names a BPE tokenizer's pre-tokenizer by the hash of its tokens on a
probe text and refuses hashes it does not list. The benchmark's tokenizer is our own tiny
byte-level BPE (gpu_workers/tiny/tokenizer.py), unknown to it; its pre-tokenizer is exactly
GPT-2's (ByteLevel, GPT-2's split regex, no normalizer), so an unlisted hash of such a
tokenizer is written as llama.cpp's `gpt-2` pre-tokenizer. Any other unknown tokenizer is
still refused.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))

OUTTYPES = ("f32", "bf16", "q8_0")


def log(msg: str) -> None:
    print(f"[convert_to_gguf] {msg}", file=sys.stderr, flush=True)


def llama_cpp_dir() -> Path:
    """The unpacked llama.cpp tree of bench/build_llama_cpp.sh (which builds it if needed)."""
    binary = (
        subprocess.run([str(BENCH / "build_llama_cpp.sh")], check=True, capture_output=True, text=True, cwd=REPO)
        .stdout.strip()
        .splitlines()[-1]
    )
    dest = Path(binary).parents[2]  # <cache>/llama.cpp-<v>/build/bin/llama-server
    (src,) = dest.glob("llama_cpp_python-*/vendor/llama.cpp")
    return src


def gpt2_byte_level(model_dir: Path) -> bool:
    """tokenizer.json's pre-tokenizer is GPT-2's: ByteLevel with its regex, nothing before it."""
    try:
        tok = json.loads((model_dir / "tokenizer.json").read_text())
    except (OSError, ValueError):
        return False
    pre = tok.get("pre_tokenizer") or {}
    return (
        tok.get("normalizer") is None
        and tok.get("model", {}).get("type") == "BPE"
        and pre.get("type") == "ByteLevel"
        and pre.get("use_regex", True)
    )


def _convert_in_process(llama_dir: Path, argv: list[str]) -> None:
    """Run convert_hf_to_gguf.py's main here (argv: its arguments), with the pre-tokenizer
    fallback above."""
    sys.path[:0] = [str(llama_dir), str(llama_dir / "gguf-py")]
    from conversion import base  # llama.cpp's, from the tree just put first on the path

    known = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return known(self, tokenizer)
        except NotImplementedError:
            if not gpt2_byte_level(Path(self.dir_model)):
                raise
            log("pre-tokenizer hash unlisted; the tokenizer is GPT-2's byte-level BPE: writing 'gpt-2'")
            return "gpt-2"

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    sys.argv = [str(llama_dir / "convert_hf_to_gguf.py"), *argv]
    runpy.run_path(str(llama_dir / "convert_hf_to_gguf.py"), run_name="__main__")


def convert(model_dir: Path, outtype: str, out: Path, llama_dir: Path) -> Path:
    weights = max(p.stat().st_mtime for p in model_dir.glob("*.safetensors"))
    if out.exists() and out.stat().st_mtime > weights:
        log(f"reusing {out}")
        return out
    tmp = out.with_suffix(".part")
    # A child per file: the converter keeps module state, and a failure names its outtype.
    cmd = [
        sys.executable,
        __file__,
        "--_convert",
        str(llama_dir),
        str(model_dir),
        "--outtype",
        outtype,
        "--outfile",
        str(tmp),
    ]
    log(f"{model_dir.name} -> {out.name}")
    subprocess.run(cmd, check=True)
    os.replace(tmp, out)
    return out


def gguf_files(size: str, outtypes: tuple[str, ...] = OUTTYPES, ckpt: Path | None = None) -> dict[str, Path]:
    """The checkpoint (made if needed) converted to each outtype: {outtype: path}."""
    from make_checkpoint import make_checkpoint

    try:
        import sentencepiece  # noqa: F401 - the converter imports it on the way
    except ImportError:
        sys.exit("convert_to_gguf: llama.cpp's converter needs sentencepiece: .venv/bin/pip install sentencepiece")
    model_dir = (ckpt or BENCH / ".cache" / f"qwen2-{size}").resolve()
    make_checkpoint(model_dir, size)
    llama_dir = llama_cpp_dir()
    return {t: convert(model_dir, t, model_dir.parent / f"{model_dir.name}-{t}.gguf", llama_dir) for t in outtypes}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--_convert"]:
        _convert_in_process(Path(argv[1]), argv[2:])
        return 0
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], epilog=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size", default="100m", choices=["100m", "tiny"])
    ap.add_argument("--ckpt", type=Path, default=None, help="checkpoint dir (default bench/.cache/qwen2-<size>)")
    ap.add_argument("--outtypes", default=",".join(OUTTYPES), help=f"comma list of {', '.join(OUTTYPES)}")
    args = ap.parse_args(argv)
    types = tuple(t.strip() for t in args.outtypes.split(",") if t.strip())
    for t, path in gguf_files(args.size, types, args.ckpt).items():
        print(f"{t}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
