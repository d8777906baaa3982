"""What the server and every worker kind import, under this machine's torch and packages.

The smoke's first phase on the lent GPU (the carried wheels installed), and the dry run's check
under the lent package set simulated here (lent.py). Prints one line per fact; exit 1 when an
import fails, naming it.
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback

# the server's entry point, the worker process's, and every runner it can be asked for
MODULES = (
    "omni.cli.main",
    "gpu_workers.worker",
    "gpu_workers.llm.runner",
    "gpu_workers.encoder.runner",
    "gpu_workers.vision_decoder.runner",
    "gpu_workers.audio_decoder.runner",
)
CARRIED = ("av", "llguidance", "msgspec", "orjson")  # bundle.py's wheels the project imports


def main() -> int:
    t = time.perf_counter()
    import torch

    failed = []
    for name in (*CARRIED, *MODULES):
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - every failure is a finding, named
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
            traceback.print_exc(file=sys.stderr)
    versions = " ".join(f"{m} {getattr(sys.modules.get(m), '__version__', '?')}" for m in CARRIED if m in sys.modules)
    print(f"imports under torch {torch.__version__}: {len(MODULES) - len(failed)}/{len(MODULES)} project modules "
          f"in {time.perf_counter() - t:.1f} s; {versions}")  # fmt: skip
    # tvm_ffi (flashinfer) JIT-builds a DLPack addon when torch lacks this
    dlpack = any(hasattr(torch.Tensor, n) for n in ("__dlpack_c_exchange_api__", "__c_dlpack_exchange_api__"))
    print(f"torch has the DLPack C exchange API: {dlpack}")
    for f in failed:
        print(f"FAILED {f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
