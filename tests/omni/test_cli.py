"""Flag parsing into the server's frozen config (no server is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_workers.tiny_checkpoints import make_tiny_checkpoint, make_tiny_omni_checkpoint
from omni.cli import build_parser, config_from_args


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("models")
    return make_tiny_checkpoint(root / "text", "llama"), make_tiny_omni_checkpoint(root / "omni")


def test_omni_layout_gets_its_encoder_and_text_layout_none(dirs: tuple[Path, Path]) -> None:
    text, omni = dirs
    args = build_parser().parse_args(["--model", f"t={text}", "--model", f"o={omni}", "--allow-remote-media"])
    config = config_from_args(args)
    by_name = {e.model_name: e for e in config.engines}
    assert by_name["t"].model_dir == text.resolve() and by_name["t"].encoder_dir is None
    assert by_name["o"].model_dir == omni.resolve() / "llm" and by_name["o"].encoder_dir == omni.resolve()
    assert by_name["o"].media_limits.allow_remote


def test_cpu_threads_are_split_over_llm_and_encoder_workers(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    text, omni = dirs
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    only_text = config_from_args(build_parser().parse_args(["--model", str(text)]))
    assert only_text.engines[0].num_threads == 8
    omni_args = ["--model", str(omni)]
    with_decoder = config_from_args(build_parser().parse_args(omni_args))
    assert with_decoder.engines[0].num_threads == 2  # the LLM worker, the encoder and the image decoder
    with_encoder = config_from_args(build_parser().parse_args([*omni_args, "--no-image-output"]))
    assert with_encoder.engines[0].num_threads == 4  # the LLM worker and the encoder worker
    assert with_encoder.engines[0].vision_decoder_dir is None
    two_ranks = config_from_args(build_parser().parse_args([*omni_args, "--vision-decoder-devices", "cpu,cpu"]))
    assert two_ranks.engines[0].num_threads == 2  # 8 cores over 4 CPU processes
    elsewhere = config_from_args(
        build_parser().parse_args([*omni_args, "--encoder-device", "cuda:0", "--vision-decoder-devices", "cuda:1"])
    )
    assert elsewhere.engines[0].num_threads == 8
    assert elsewhere.engines[0].vision_decoder_devices == ("cuda:1",)


def test_a_directory_that_is_no_checkpoint_exits_with_a_message(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="neither config.json nor llm/config.json"):
        config_from_args(build_parser().parse_args(["--model", str(tmp_path)]))


def test_chat_format_flags(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    text, _ = dirs
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    args = ["--model", str(text), "--chat-template", str(template), "--tool-call-parser", "hermes"]
    engine = config_from_args(build_parser().parse_args([*args, "--no-enable-auto-tool-choice", "--trust-request-chat-template"])).engines[0]
    assert engine.chat_template == "{{ messages[0]['content'] }}"
    assert (engine.tool_call_parser, engine.enable_auto_tool_choice, engine.trust_request_chat_template) == ("hermes", False, True)
    default = config_from_args(build_parser().parse_args(["--model", str(text)])).engines[0]
    assert (default.chat_template, default.tool_call_parser, default.reasoning_parser) == (None, "auto", "auto")
    assert default.enable_auto_tool_choice and not default.trust_request_chat_template
    inline = config_from_args(build_parser().parse_args(["--model", str(text), "--chat-template", "{{ 'x' }}"]))
    assert inline.engines[0].chat_template == "{{ 'x' }}"


@pytest.mark.parametrize(
    "flags", [["--tool-call-parser", "mistral"], ["--reasoning-parser", "nope"], ["--chat-template", "/no/such/file"]]
)
def test_bad_chat_format_flags_exit_with_a_message(dirs: tuple[Path, Path], flags: list[str]) -> None:
    with pytest.raises(SystemExit, match="omni-serve:"):
        config_from_args(build_parser().parse_args(["--model", str(dirs[0]), *flags]))
