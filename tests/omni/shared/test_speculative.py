"""--speculative-config: vLLM's JSON read, or the server refuses to start naming what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni.cli.options import parse_args, server_config
from omni.engines.worker_specs import llm_worker_spec
from omni.shared.speculative import SpeculativeConfig, parse_speculative_config


def test_vllm_keys_and_defaults() -> None:
    assert parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4}') == (
        SpeculativeConfig("ngram", 5, 4, 4)
    )
    # vLLM's defaults: 5 and 5 when neither bound is given; the older "[ngram]" spelling
    assert parse_speculative_config('{"method": "[ngram]", "num_speculative_tokens": 3}') == SpeculativeConfig("ngram", 3, 5, 5)
    spec = parse_speculative_config(
        '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 3, '
        '"disable_by_batch_size": 8}'
    )
    assert spec == SpeculativeConfig("ngram", 4, 2, 3, 8)
    assert "off above 8 running" in spec.describe()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"num_speculative_tokens": 3}', "method is required"),
        ('{"method": "eagle", "num_speculative_tokens": 3}', "'eagle': needs a draft model"),
        ('{"method": "draft_model", "num_speculative_tokens": 3}', "needs a draft model"),
        ('{"method": "medusa2", "num_speculative_tokens": 3}', "not a method omni-serve knows (served: ngram)"),
        ('{"method": "ngram"}', "num_speculative_tokens is required"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens must be in [1, 15], got 0"),
        ('{"method": "ngram", "num_speculative_tokens": 2.5}', "num_speculative_tokens must be an integer"),
        ('{"method": "ngram", "num_speculative_tokens": true}', "must be an integer"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
         "prompt_lookup_min (4) must not exceed prompt_lookup_max (2)"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0}', "prompt_lookup_min must be at least 1"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "model": "x"}', "model: only a draft model takes it"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "lookahead": 2}', "unknown key 'lookahead'"),
    ],
)  # fmt: skip
def test_bad_values_say_what_is_wrong(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=None) as info:
        parse_speculative_config(text)
    assert says in str(info.value)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    from gpu_workers.tiny.checkpoints import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path / "m", "llama")


def test_the_server_exits_with_status_2_naming_it(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_args([str(model_dir), "--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 3}'])
    with pytest.raises(SystemExit) as info:
        server_config(args)
    assert info.value.code == 2
    assert "--speculative-config: method 'eagle3': needs a draft model" in capsys.readouterr().err


def test_the_setting_reaches_the_workers(model_dir: Path) -> None:
    text = json.dumps({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 3})
    config = server_config(parse_args([str(model_dir), "--speculative-config", text])).models[0]
    assert config.llm.speculative == SpeculativeConfig("ngram", 4, 2, 3)
    spec = llm_worker_spec(config, 0, "cpu")
    assert (spec.speculative_method, spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max) == (
        "ngram", 4, 2, 3,
    )  # fmt: skip
    plain = server_config(parse_args([str(model_dir)])).models[0]
    assert plain.llm.speculative is None and llm_worker_spec(plain, 0, "cpu").speculative_method is None
