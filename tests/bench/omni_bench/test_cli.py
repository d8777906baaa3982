import asyncio
import json
import socket
import sys
from pathlib import Path

import pytest

from bench.omni_bench import cli

from .conftest import MODEL

ROOT = Path(__file__).resolve().parents[3]


async def bench(*argv: str) -> int:
    args = cli.build_parser().parse_args(list(argv))
    return await cli.run(args, *cli.configs(args))


async def test_json_result_file(fake_server, tmp_path, capsys):
    out = tmp_path / "result.json"
    rc = await bench("--base-url", fake_server.url, "--workload", "shared-prefix", "--num-groups", "2",
                     "--questions-per-group", "3", "--prefix-len", "20", "--question-len", "4",
                     "--max-tokens", "3", "--concurrency", "2", "--warmup", "1", "--api-key", "sk-secret",
                     "--slo", "ttft=5,e2e=10", "--no-progress", "--out", str(out))
    assert rc == 0
    result = json.loads(out.read_text())
    assert set(result) == {"schema", "created", "config", "summary", "requests", "warmup"}
    assert result["schema"] == "omni-bench/1"
    config = result["config"]
    assert config["model"] == MODEL  # discovered from /v1/models
    assert config["workload"]["name"] == "shared-prefix" and config["workload"]["num_groups"] == 2
    assert config["load"]["concurrency"] == 2
    assert config["slo"] == {"ttft_s": 5.0, "tpot_s": None, "e2e_s": 10.0}
    assert "sk-secret" not in out.read_text()
    s = result["summary"]
    assert (s["num_requests"], s["num_completed"], s["num_errors"]) == (6, 6, 0)
    # Prompt = 20 prefix words + "Question q:" + 4 words + "?" glued to the last word.
    assert s["total_prompt_tokens"] == 6 * (20 + 2 + 4) and s["total_completion_tokens"] == 18
    assert s["total_cached_tokens"] == 6 * 13 and s["prefix_cache_hit_rate"] == 0.5
    assert s["goodput"]["num_good"] == 6 and s["goodput"]["fraction"] == 1.0
    assert set(s["ttft"]) == {"count", "mean", "p50", "p90", "p99"}
    assert len(result["requests"]) == 6 and len(result["warmup"]) == 1
    record = result["requests"][0]
    assert record["outcome"] == "ok" and record["group"] in (0, 1) and record["tpot_s"] > 0
    assert {"ttft_s", "e2e_s", "itl_s", "num_prompt_tokens", "num_completion_tokens",
            "num_cached_tokens", "http_status", "error"} <= set(record)
    printed = capsys.readouterr().out
    assert "omni-bench" in printed and "TTFT" in printed and f"wrote {out}" in printed


async def test_errors_give_exit_status_one(fake_server, capsys):
    fake_server.fail_every = 2
    rc = await bench("--base-url", fake_server.url, "--model", "m", "--num-requests", "4",
                     "--input-len", "3", "--max-tokens", "2", "--request-rate", "inf", "--warmup", "0",
                     "--no-progress")
    assert rc == 1
    assert "2 x HTTP 429: slow down" in capsys.readouterr().out


async def test_plot(fake_server, tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    argv = ("--base-url", fake_server.url, "--num-requests", "4", "--input-len", "3",
            "--max-tokens", "3", "--warmup", "0", "--no-progress")
    assert await bench(*argv, "--plot", str(tmp_path / "a.png")) == 0
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    assert await bench(*argv, "--plot", str(tmp_path / "b.png")) == 0
    assert not (tmp_path / "b.png").exists()
    assert "--plot needs matplotlib" in capsys.readouterr().err


async def test_unreachable_server_is_reported(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again before the run: nothing listens
    assert await bench("--base-url", f"http://127.0.0.1:{port}/v1", "--no-progress") == 2
    assert "cannot list models" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["--max-concurrency", "2"],  # only for the open loop
    ["--concurrency", "2", "--request-rate", "1"],
    ["--extra-body", "[1]"],
    ["--slo", "itl=1"],
    ["--max-tokens", "0"],
])
def test_bad_flags_exit_with_usage(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2


async def test_bin_wrapper_end_to_end(fake_server, tmp_path):
    out = tmp_path / "r.json"
    proc = await asyncio.create_subprocess_exec(
        str(ROOT / "bin" / "omni-bench"), "--base-url", fake_server.url, "--workload", "multi-turn",
        "--num-conversations", "2", "--turns", "2", "--input-len", "3", "--max-tokens", "2",
        "--out", str(out), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout=120)  # a hang guard
    assert proc.returncode == 0, stderr.decode()
    assert b"TTFT" in stdout
    assert json.loads(out.read_text())["summary"]["num_completed"] == 4
    assert b"req" in stderr  # the progress bar
