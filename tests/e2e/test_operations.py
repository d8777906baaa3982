"""A server started the way a vLLM user starts one: positional model, vLLM's flags, HTTPS,
a root path behind a proxy, JSON logs with the request id on every line of the request."""

from __future__ import annotations

import datetime
import ipaddress
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.e2e.server import ROOT, free_port


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (the test's own CA: it trusts just this one)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


def test_vllm_launch_line_https_root_path_and_json_logs(tiny_model_dir: Path, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    port = free_port()
    log_path = tmp_path / "server.log"
    line = [str(tiny_model_dir), "--served-model-name", "x", "--max-model-len", "4096",
            "--gpu-memory-utilization", "0.9", "--enable-prefix-caching", "--seed", "0", "--port", str(port),
            "--num-threads", "1", "--enforce-eager",
            "--ssl-keyfile", str(key), "--ssl-certfile", str(cert), "--root-path", "/omni",
            "--log-format", "json", "--log-level", "INFO"]  # fmt: skip
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "omni.cli.main", *line],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    trust = ssl.create_default_context(cafile=str(cert))
    base = f"https://127.0.0.1:{port}"
    try:
        with httpx.Client(verify=trust, timeout=120) as client:
            deadline = time.monotonic() + 120
            while True:
                assert proc.poll() is None, log_path.read_text()
                try:
                    if client.get(f"{base}/omni/health").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "no healthy server"
                time.sleep(0.2)
            body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            r = client.post(f"{base}/omni/v1/chat/completions", json=body, headers={"X-Request-Id": "ops-1"})
            assert r.status_code == 200 and r.headers["X-Request-Id"] == "ops-1"
            assert r.json()["model"] == "x"
            # a proxy that strips the prefix reaches the same routes
            assert [m["id"] for m in client.get(f"{base}/v1/models").json()["data"]] == ["x"]
            assert client.get(f"{base}/omni/openapi.json").json()["servers"] == [{"url": "/omni"}]
            bad = client.post(f"{base}/omni/v1/chat/completions", json={"model": "x"}, headers={"X-Request-Id": "ops-2"})
            assert bad.status_code == 400 and bad.json()["error"]["request_id"] == "ops-2"
            with pytest.raises(httpx.TransportError):  # no plain HTTP on the TLS port
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    assert code == 0
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    entries = [orjson.loads(line) for line in lines]  # every line is JSON
    access = [e for e in entries if e["logger"] == "omni.access"]
    ok = next(e for e in access if e.get("request_id") == "ops-1")
    assert (ok["status"], ok["model"], ok["path"]) == (200, "x", "/omni/v1/chat/completions")
    assert ok["prompt_tokens"] > 0 and ok["output_tokens"] > 0 and ok["latency_ms"] > 0 and "ttft_ms" in ok
    assert next(e for e in access if e.get("request_id") == "ops-2")["status"] == 400
    assert any(e["logger"] == "omni.cli.main" and "https://127.0.0.1" in e["message"] for e in entries)
    assert any(e["message"] == "all workers ready" for e in entries)
