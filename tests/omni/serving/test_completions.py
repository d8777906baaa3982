"""The completions lifecycle, called directly with a FakePool for the workers: n choices per
prompt numbered prompt-major, nothing submitted before the outputs run, and the prompt checked
before the model's state."""

from __future__ import annotations

import pytest

from omni.errors import APIError
from omni.serving import completions as lifecycle
from omni.serving.model import ModelRegistry
from omni.serving.requests import parse_completion_request
from tests.omni.fake_pool import FakePool
from tests.omni.serving.text_model import REPLY, run


async def test_completions_number_choices_prompt_major(models: ModelRegistry, pool: FakePool) -> None:
    req = parse_completion_request({"model": "m", "prompt": [[3, 4], [5]], "n": 2})
    completion = await lifecycle.completion(models, req, timeout=None)
    assert pool.submitted == []
    assert completion.id.startswith("cmpl-")
    assert await run(completion.outputs) == [(REPLY, "length")] * 4
    assert [(req.request_id, req.prompt_token_ids) for req in pool.submitted] == [
        (f"{completion.id}-0", [3, 4]),
        (f"{completion.id}-1", [3, 4]),
        (f"{completion.id}-2", [5]),
        (f"{completion.id}-3", [5]),
    ]
    n = len(pool.tokens)
    assert [(o.usage.prompt_tokens, o.usage.completion_tokens) for o in completion.outputs] == [
        (2, n), (2, n), (1, n), (1, n),
    ]  # fmt: skip


async def test_completions_check_the_prompt_before_the_503(models: ModelRegistry, pool: FakePool) -> None:
    pool.serving = False
    with pytest.raises(APIError) as e:
        await lifecycle.completion(models, parse_completion_request({"model": "m", "prompt": [[1 << 20]]}), timeout=None)
    assert (e.value.status, e.value.param) == (400, "prompt")
    with pytest.raises(APIError) as e:
        await lifecycle.completion(models, parse_completion_request({"model": "m", "prompt": "Hello"}), timeout=None)
    assert e.value.status == 503
    assert pool.submitted == []
