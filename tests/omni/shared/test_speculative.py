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


def test_suffix_keys_and_defaults() -> None:
    # vLLM's defaults; num_speculative_tokens: vLLM's (the tree depth), at most 15
    spec = parse_speculative_config('{"method": "suffix"}')
    assert spec == SpeculativeConfig("suffix", 15)
    assert (
        spec.suffix_decoding_max_tree_depth,
        spec.suffix_decoding_max_cached_requests,
        spec.suffix_decoding_max_spec_factor,
        spec.suffix_decoding_min_token_prob,
    ) == (24, 10000, 1.0, 0.1)
    assert spec.describe() == (
        "suffix, up to 15 draft tokens, trees 24 deep over each request and the outputs of the last 10000 "
        "requests, drafts up to 1 x the match while likelier than 0.1"
    )
    assert parse_speculative_config('{"method": "suffix", "suffix_decoding_max_tree_depth": 6}').num_speculative_tokens == 6
    text = json.dumps({
        "method": "suffix", "num_speculative_tokens": 4, "suffix_decoding_max_tree_depth": 32,
        "suffix_decoding_max_cached_requests": 0, "suffix_decoding_max_spec_factor": 2,
        "suffix_decoding_min_token_prob": 0, "disable_by_batch_size": 16,
    })  # fmt: skip
    assert parse_speculative_config(text) == SpeculativeConfig(
        "suffix", 4, disable_by_batch_size=16, suffix_decoding_max_tree_depth=32,
        suffix_decoding_max_cached_requests=0, suffix_decoding_max_spec_factor=2.0, suffix_decoding_min_token_prob=0.0,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("{", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"num_speculative_tokens": 3}', "method is required"),
        ('{"method": "eagle", "num_speculative_tokens": 3}', "'eagle': needs a draft model"),
        ('{"method": "draft_model", "num_speculative_tokens": 3}', "needs a draft model"),
        ('{"method": "medusa2", "num_speculative_tokens": 3}', "not a method omni-serve knows (served: ngram, suffix)"),
        ('{"method": "ngram"}', "num_speculative_tokens is required"),
        ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens must be in [1, 15], got 0"),
        ('{"method": "ngram", "num_speculative_tokens": 2.5}', "num_speculative_tokens must be an integer"),
        ('{"method": "ngram", "num_speculative_tokens": true}', "must be an integer"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
         "prompt_lookup_min (4) must not exceed prompt_lookup_max (2)"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 0}', "prompt_lookup_min must be at least 1"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "model": "x"}', "model: only a draft model takes it"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "lookahead": 2}', "unknown key 'lookahead'"),
        ('{"method": "ngram", "num_speculative_tokens": 3, "suffix_decoding_max_tree_depth": 8}',
         "suffix_decoding_max_tree_depth: only method suffix takes it, not ngram"),
        ('{"method": "suffix", "prompt_lookup_max": 4}', "prompt_lookup_max: only method ngram takes it, not suffix"),
        ('{"method": "suffix", "num_speculative_tokens": 16}', "num_speculative_tokens must be in [1, 15], got 16"),
        ('{"method": "suffix", "suffix_decoding_max_tree_depth": 0}', "suffix_decoding_max_tree_depth must be in [1, 64], got 0"),
        ('{"method": "suffix", "suffix_decoding_max_tree_depth": 65}', "suffix_decoding_max_tree_depth must be in [1, 64]"),
        ('{"method": "suffix", "suffix_decoding_max_cached_requests": -1}',
         "suffix_decoding_max_cached_requests must be at least 0, got -1"),
        ('{"method": "suffix", "suffix_decoding_max_cached_requests": 1.5}', "suffix_decoding_max_cached_requests must be an integer"),
        ('{"method": "suffix", "suffix_decoding_max_spec_factor": 0}', "suffix_decoding_max_spec_factor must be above 0, got 0"),
        ('{"method": "suffix", "suffix_decoding_max_spec_factor": "2"}', "suffix_decoding_max_spec_factor must be a number"),
        ('{"method": "suffix", "suffix_decoding_min_token_prob": 1.5}', "suffix_decoding_min_token_prob must be in [0, 1], got 1.5"),
        ('{"method": "suffix", "suffix_decoding_min_token_prob": -0.1}', "suffix_decoding_min_token_prob must be in [0, 1]"),
        ('{"method": "suffix", "suffix_decoding_min_token_prob": NaN}', "suffix_decoding_min_token_prob must be a number"),
        ('{"method": "suffix", "model": "x"}', "model: only a draft model takes it, and suffix drafts without one"),
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
    text = json.dumps({"method": "suffix", "suffix_decoding_max_tree_depth": 12, "suffix_decoding_min_token_prob": 0.2})
    spec = llm_worker_spec(server_config(parse_args([str(model_dir), "--speculative-config", text])).models[0], 0, "cpu")
    assert (spec.speculative_method, spec.num_speculative_tokens, spec.suffix_decoding_max_tree_depth) == ("suffix", 12, 12)
    assert (spec.suffix_decoding_max_cached_requests, spec.suffix_decoding_max_spec_factor) == (10000, 1.0)
    assert spec.suffix_decoding_min_token_prob == 0.2
    plain = server_config(parse_args([str(model_dir)])).models[0]
    assert plain.llm.speculative is None and llm_worker_spec(plain, 0, "cpu").speculative_method is None
