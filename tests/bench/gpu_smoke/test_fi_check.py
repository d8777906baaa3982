"""bench/gpu_smoke/fi_check.py's calls (our backend API, paged_varlen_reference), run on the CPU
with torch_sdpa in FlashInfer's place: on the lent GPU only the backend differs."""

from __future__ import annotations

from typing import Any

import pytest

from bench.gpu_smoke import fi_check


@pytest.mark.parametrize("rows", ["short", "long"])
def test_the_check_passes_with_a_backend_that_matches_the_reference(rows: str) -> None:
    out: dict[str, Any] = {}
    assert fi_check.check(rows, "4,2,64", out, backend_name="torch_sdpa", device="cpu")
    assert out["backend"] == "TorchSDPABackend" and out["max_abs_err"] < fi_check.TOLERANCE
