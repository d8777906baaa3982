"""`omni-serve`: parse flags, make sure a model exists, run the HTTP server until signalled."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import ssl
import sys
import time

from aiohttp import web

from omni.cli.options import parse_args, server_config
from omni.cli.preflight import check_devices_present, check_memory
from omni.cli.sd_notify import Notifier
from omni.config import ServerConfig
from omni.http.access_log import AccessLogger
from omni.http.app import STARTUP, create_app
from omni.http.connections import ConnectionLimits, ServerRunner
from omni.http.state import MODELS
from omni.serving.model import ModelRegistry
from omni.shared.log_format import setup_logging

log = logging.getLogger("omni.cli.main")


def ssl_context(config: ServerConfig) -> ssl.SSLContext | None:
    if not config.ssl_certfile:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.ssl_certfile, config.ssl_keyfile)
        if config.ssl_ca_certs:
            context.load_verify_locations(config.ssl_ca_certs)
    except (OSError, ssl.SSLError) as exc:
        raise SystemExit(f"omni-serve: TLS: {exc}") from None
    context.verify_mode = ssl.VerifyMode(config.ssl_cert_reqs)
    return context


class ServingCheck:
    """The watchdog's health rule: every model has at least one ready LLM worker, and its
    encoder and image decoder (if any) are ready. A worker that died is restarted by its
    supervisor, which takes as long as loading it (up to --worker-start-timeout): while the
    rule fails the pings go on for that long after it last held, then stop, and systemd
    restarts the whole server. Before READY=1 (loading) only the loop's liveness counts."""

    def __init__(self, registry: ModelRegistry, grace_s: float) -> None:
        self.registry = registry
        self.grace_s = grace_s
        self.last_ok: float | None = None  # monotonic time the rule last held; None: loading

    def __call__(self) -> bool:
        if self.last_ok is None:
            return True
        now = time.monotonic()
        models = list(self.registry)
        if models and all(
            m.pool.serving
            and (m.media is None or m.media.ready)
            and all(o.ready for o in m.outputs)
            for m in models
        ):
            self.last_ok = now
        return now - self.last_ok <= self.grace_s


def _freeze_startup_heap() -> None:
    """Move what startup made (modules, tokenizers, the app) out of the collector's sight: a
    full collection walks every tracked object holding the GIL, and the hundreds of thousands
    loaded at startup made each one a pause for every request in flight."""
    gc.collect()
    gc.freeze()
    log.info("startup heap frozen: %d objects no longer collected", gc.get_freeze_count())


# How soon a thread holding the GIL (a template rendering, a large body decoding) hands it to
# the event loop when the loop asks: CPython's default is 5 ms, paid at every wake-up of the
# loop while the thread runs, so a short request waited tens of ms behind a 60 MB one.
_SWITCH_INTERVAL_S = 0.001


async def serve(config: ServerConfig, notifier: Notifier | None = None) -> int:
    """Run until SIGINT/SIGTERM; return the process exit code."""
    notifier = notifier or Notifier(None)
    notifier.notify("STATUS=loading workers")
    sys.setswitchinterval(_SWITCH_INTERVAL_S)
    app = create_app(config)
    # handler_cancellation: a client that disconnects cancels its handler, which aborts
    # its request and frees its KV blocks at once.
    # shutdown_timeout: on SIGTERM the socket closes at once and in-flight requests get this
    # long to finish before their handlers are cancelled (their requests aborted).
    # The connection limits: header deadline, keep-alive, open connections (omni/http/connections.py).
    limits = ConnectionLimits(config.header_timeout, config.keepalive_timeout, config.max_connections)
    access = None if config.disable_log_requests else logging.getLogger("omni.access")
    runner = ServerRunner(
        app,
        limits,
        handler_cancellation=True,
        access_log=access,
        access_log_class=AccessLogger,
        shutdown_timeout=config.shutdown_timeout,
    )
    try:
        await runner.setup()  # runs the cleanup contexts: workers start loading here
    except (OSError, ValueError) as exc:  # e.g. a model directory without a usable tokenizer
        log.error("could not start: %s", exc)
        return 1
    check = ServingCheck(app[MODELS], max(m.worker.worker_start_timeout for m in config.models))
    # The ping task lives as long as serve(): through the drain too, which systemd times
    # with TimeoutStopSec but may still watch.
    pings = asyncio.create_task(notifier.ping_watchdog(check), name="sd-watchdog")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    exit_code = 0
    try:
        site = web.TCPSite(runner, config.host, config.port, ssl_context=ssl_context(config))
        await site.start()
        log.info("omni-serve listening on %s", config.base_url)
        startup = app[STARTUP]
        stopped = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({startup, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if startup.done() and not startup.cancelled() and startup.exception() is not None:
                log.error("could not start: %s", startup.exception())
                exit_code = 1
            else:
                if startup.done():
                    log.info("all workers ready")
                    # start_all() has returned: every worker of every model is ready, so
                    # /health answers 200 from here on.
                    check.last_ok = time.monotonic()
                    _freeze_startup_heap()
                    n = len(app[MODELS])
                    notifier.notify("READY=1", f"STATUS=serving {n} model{'s' if n != 1 else ''}")
                await stopped
        finally:
            stopped.cancel()
    except OSError as exc:  # e.g. the port is taken
        log.error("could not listen on %s:%d: %s", config.host, config.port, exc)
        exit_code = 1
    finally:
        log.info("shutting down")
        notifier.notify("STOPPING=1", "STATUS=draining")
        try:
            await runner.cleanup()
        finally:
            pings.cancel()
            notifier.close()
    return exit_code


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    setup_logging(args.log_level, args.log_format)
    # Worker processes read these when they set up their own logging.
    os.environ["OMNI_LOG_LEVEL"] = args.log_level
    os.environ["OMNI_LOG_FORMAT"] = args.log_format
    config = server_config(args)
    check_devices_present(config)  # here, not in server_config: see omni/cli/preflight.py
    check_memory(config)
    notifier = Notifier.from_env(os.environ)  # before any worker is spawned (they inherit it)
    try:
        import uvloop  # noqa: PLC0415
    except ImportError:
        code = asyncio.run(serve(config, notifier))
    else:
        code = uvloop.run(serve(config, notifier))
    raise SystemExit(code)


if __name__ == "__main__":
    main()
