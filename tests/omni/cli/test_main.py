"""The serving entry point's own rules: the watchdog's health check (loading counts as alive;
once serving, every model needs a live LLM worker and its encoder and decoders ready, with a
grace as long as a restart takes) and the TLS context the flags make. The whole process is run
by tests/e2e/test_operations.py and tests/e2e/test_failures.py."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest

from omni.cli import main as cli_main
from omni.cli.main import ServingCheck, ssl_context
from omni.config import ServerConfig
from omni.engines.audio_decoder import AudioDecoderEngine
from omni.engines.pool import ModelPool
from omni.modalities.outputs.audio import ModelAudio
from omni.serving.model import ModelRegistry, ServedModel
from omni.shared.store.local import LocalStore
from omni.text.tokenizer import TextTokenizer
from tests.omni.fake_pool import FakePool
from tests.omni.modalities.outputs.fake_vocoder import FakeDecoder


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(cli_main.time, "monotonic", clock)
    return clock


def registry(tiny_tokenizer_dir: Path, tmp_path: Path) -> tuple[ModelRegistry, FakePool, FakeDecoder]:
    tokenizer = TextTokenizer.from_dir(tiny_tokenizer_dir)
    pool, vocoder = FakePool([1]), FakeDecoder()
    audio = ModelAudio.for_model(cast(AudioDecoderEngine, vocoder), tokenizer, LocalStore(tmp_path, "", b"s"))
    models = ModelRegistry()
    models.add(ServedModel("m", tokenizer, cast(ModelPool, pool), created=0, outputs=(audio,)))
    return models, pool, vocoder


def test_while_loading_only_liveness_counts(tiny_tokenizer_dir: Path, tmp_path: Path, clock: Clock) -> None:
    models, pool, _ = registry(tiny_tokenizer_dir, tmp_path)
    pool.serving = False
    check = ServingCheck(models, grace_s=60.0)
    assert check.last_ok is None and check()


def test_a_failing_rule_is_forgiven_for_the_grace_then_not(tiny_tokenizer_dir: Path, tmp_path: Path, clock: Clock) -> None:
    models, pool, vocoder = registry(tiny_tokenizer_dir, tmp_path)
    check = ServingCheck(models, grace_s=60.0)
    check.last_ok = clock.now  # READY=1 was sent
    clock.now += 100
    assert check() and check.last_ok == clock.now  # all ready: the rule holds now
    vocoder.ready = False  # the audio decoder's worker died, and is restarting
    clock.now += 60
    assert check()  # within the grace
    clock.now += 1
    assert not check()  # past it: the pings stop, systemd restarts the server
    vocoder.ready = True
    assert check()
    pool.serving = False  # no LLM worker at all
    clock.now += 61
    assert not check()


def test_no_models_never_holds(clock: Clock) -> None:
    check = ServingCheck(ModelRegistry(), grace_s=5.0)
    check.last_ok = clock.now
    clock.now += 6
    assert not check()


def test_tls_is_off_without_a_certificate_and_a_bad_one_exits_saying_why(tmp_path: Path) -> None:
    assert ssl_context(ServerConfig()) is None
    (tmp_path / "cert.pem").write_text("not a certificate")
    with pytest.raises(SystemExit, match="omni-serve: TLS:"):
        ssl_context(ServerConfig(ssl_certfile=str(tmp_path / "cert.pem")))
    with pytest.raises(SystemExit, match="omni-serve: TLS:"):
        ssl_context(ServerConfig(ssl_certfile=str(tmp_path / "absent.pem")))


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.mark.parametrize(("reqs", "mode"), [(0, ssl.CERT_NONE), (2, ssl.CERT_REQUIRED)])
def test_a_certificate_makes_a_server_context_asking_clients_as_told(tmp_path: Path, reqs: int, mode: ssl.VerifyMode) -> None:
    cert, key = self_signed(tmp_path)
    context = ssl_context(ServerConfig(ssl_certfile=str(cert), ssl_keyfile=str(key), ssl_ca_certs=str(cert), ssl_cert_reqs=reqs))
    assert context is not None and context.verify_mode == mode
    assert context.cert_store_stats()["x509"] == 1  # the CA file's certificate, to check clients against
