import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_workers.tiny.tokenizer import build_tiny_tokenizer
from omni.serving.requests import parse_chat_completion_request
from omni.text.tokenizer import TextTokenizer


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


def test_basics(tok: TextTokenizer) -> None:
    assert tok.vocab_size == 1458  # 1444 before the reference's dialect tokens came after the codes
    assert tok.is_byte_level
    im_end = tok.token_to_id("<|im_end|>")
    assert im_end == 1282
    assert tok.eos_token_ids == frozenset({im_end})  # from tokenizer_config, no config files
    ids = tok.encode("def fibonacci 안녕 😀")
    assert tok.decode(ids) == "def fibonacci 안녕 😀"
    assert tok.encode("<|im_end|>x") == [im_end, tok.token_to_id("x")]
    assert tok.decode([im_end, 88]) == "y"
    assert tok.decode([im_end, 88], skip_special_tokens=False) == "<|im_end|>y"
    assert im_end in tok.special_token_ids
    assert tok.backend.get_vocab_size() == 1458


def test_eos_from_generation_config_then_config(tmp_path: Path) -> None:
    build_tiny_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 7}))
    assert TextTokenizer.from_dir(tmp_path).eos_token_ids == frozenset({7})
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1280, 1282]}))
    assert TextTokenizer.from_dir(tmp_path).eos_token_ids == frozenset({1280, 1282})


def test_generation_configs_default_template_kwargs_hold_unless_a_render_sets_them(tmp_path: Path) -> None:
    """default_chat_template_kwargs (vLLM's --default-chat-template-kwargs, as a checkpoint's
    generation_config.json carries it): the tiny template's skip switch closes the reasoning block
    by default; a request's own value wins."""
    build_tiny_tokenizer(tmp_path)
    plain = TextTokenizer.from_dir(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"default_chat_template_kwargs": {"skip_reasoning": True}}))
    skipping = TextTokenizer.from_dir(tmp_path)
    hi = [{"role": "user", "content": "hi"}]
    assert plain.render_prompt(hi).endswith("<|im_start|>assistant\n")
    assert skipping.render_prompt(hi).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert skipping.render_prompt(hi, skip_reasoning=False) == plain.render_prompt(hi)
    (tmp_path / "generation_config.json").write_text(json.dumps({"default_chat_template_kwargs": ["skip_reasoning"]}))
    with pytest.raises(ValueError, match="default_chat_template_kwargs is not an object"):
        TextTokenizer.from_dir(tmp_path)


def test_chat_template_from_tokenizer_config(tmp_path: Path) -> None:
    build_tiny_tokenizer(tmp_path)
    (tmp_path / "chat_template.jinja").unlink()
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["chat_template"] = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tok = TextTokenizer.from_dir(tmp_path)
    assert tok.render_chat([{"role": "user", "content": "hi"}]) == "[hi]"


def test_apply_chat_template(tok: TextTokenizer) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
    ]
    ids = tok.apply_chat_template(messages)
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHello<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.decode(ids, skip_special_tokens=False) == expected
    assert ids == tok.encode(expected, add_special_tokens=False)
    assert ids[0] == tok.token_to_id("<|im_start|>")
    assert ids.count(1282) == 2  # <|im_end|>
    no_prompt = tok.apply_chat_template(messages, add_generation_prompt=False)
    assert ids[: len(no_prompt)] == no_prompt
    assert tok.decode(ids[len(no_prompt) :], skip_special_tokens=False) == "<|im_start|>assistant\n"


def test_template_error_is_value_error(tok: TextTokenizer) -> None:
    part = {"type": "image_url", "image_url": {"url": "x"}}
    with pytest.raises(ValueError, match="unsupported content part type: image_url"):
        tok.apply_chat_template([{"role": "user", "content": [part]}])


def test_token_bytes_matches_decode(tok: TextTokenizer) -> None:
    for skip in (True, False):
        table = tok.token_bytes(skip_special_tokens=skip)
        assert len(table) == tok.vocab_size
        for i in range(tok.vocab_size):
            assert table[i].decode("utf-8", "replace") == tok.decode([i], skip_special_tokens=skip)
    assert tok.token_bytes(skip_special_tokens=True)[1282] == b""
    assert tok.token_bytes(skip_special_tokens=False)[1282] == b"<|im_end|>"


def test_server_modules_never_import_torch(tiny_tokenizer_dir: Path) -> None:
    code = f"""
import sys
import omni.errors, omni.http.errors, omni.serving.requests, omni.metrics
from omni.text.detokenizer import IncrementalDetokenizer
from omni.text.tokenizer import TextTokenizer
tok = TextTokenizer.from_dir({str(tiny_tokenizer_dir)!r})
ids = tok.apply_chat_template([{{"role": "user", "content": "hi"}}])
detok = IncrementalDetokenizer(tok, ids, stop=["x"])
detok.push(ids)
detok.finish()
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])


def test_apply_chat_template_takes_parsed_messages(tok: TextTokenizer) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello"}]},
    ]
    req = parse_chat_completion_request({"model": "m", "messages": messages})
    assert tok.apply_chat_template(req.messages) == tok.apply_chat_template(messages)
    assert tok.apply_chat_template(req.template_messages) == tok.apply_chat_template(req.messages)


@pytest.mark.parametrize(
    ("config", "num_token_ids"),
    [
        (None, 1458),  # no config.json: the tokenizer's ids
        ({"vocab_size": 1000}, 1000),  # a model with fewer rows than the tokenizer has ids
        ({"text_config": {"vocab_size": 1200}}, 1200),  # the published omni checkpoint's nesting
        ({"vocab_size": 2048}, 1458),  # rows padded past the tokenizer: ids it cannot decode
        ({"vocab_size": "big"}, 1458),
    ],
)
def test_the_ids_a_request_may_name_are_in_the_tokenizer_and_the_model(
    tmp_path: Path, config: dict[str, Any] | None, num_token_ids: int
) -> None:
    build_tiny_tokenizer(tmp_path)
    if config is not None:
        (tmp_path / "config.json").write_text(json.dumps(config))
    tok = TextTokenizer.from_dir(tmp_path)
    assert (tok.vocab_size, tok.num_token_ids) == (1458, num_token_ids)
