"""Command line of bin/omni-bench: flags -> configs -> run -> table, JSON and plot."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from typing import Any, TypeVar

import aiohttp
import orjson
from tqdm import tqdm

from bench.omni_bench.client import Client, ClientConfig, RequestFailed, open_session
from bench.omni_bench.record import RequestRecord
from bench.omni_bench.report import format_table, result_json, write_json, write_plot
from bench.omni_bench.runner import LoadConfig, Runner, planned_requests
from bench.omni_bench.summary import Slo, summarize
from bench.omni_bench.workload import (
    WORKLOADS,
    Conversation,
    LengthRange,
    MultiTurnWorkload,
    RandomWorkload,
    SharedPrefixWorkload,
    Workload,
)

DEFAULT_CONCURRENCY = 8
_EPILOG = f"""\
workloads:
  random         --num-requests prompts of --input-len random words
  shared-prefix  --num-groups system prompts of --prefix-len words, each followed by
                 --questions-per-group questions of --question-len words, sent in --order
  multi-turn     --num-conversations conversations of --turns turns of --input-len words;
                 each turn resends the whole history with the server's earlier replies

Lengths are in words of a plain English vocabulary, about one token each in common BPE
tokenizers (no tokenizer is loaded); the real counts are read from usage. A RANGE is N
or LOW:HIGH (inclusive, drawn per request with --seed).

Arrivals: closed loop (--concurrency, default {DEFAULT_CONCURRENCY}) or open loop (--request-rate R, Poisson,
optionally capped by --max-concurrency). In the open loop a multi-turn conversation starts
at each arrival and sends its next turn as soon as the previous reply is complete.
Exit status: 0 when every finished request succeeded, 1 otherwise.

examples:
  bin/omni-bench --workload random --num-requests 200 --concurrency 16 --max-tokens 128
  bin/omni-bench --workload shared-prefix --num-groups 4 --prefix-len 2000 \\
      --request-rate 4 --slo ttft=0.5,tpot=0.05 --out result.json --plot latency.png
  bin/omni-bench --workload multi-turn --num-conversations 8 --turns 5 --concurrency 4
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="omni-bench", description="Load generator for OpenAI-compatible LLM servers.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = p.add_argument_group("target")
    target.add_argument("--base-url", default="http://127.0.0.1:8000/v1",
                        help="the server's OpenAI base URL, ending in /v1 (default %(default)s)")
    target.add_argument("--model", help="model id to send (default: the first of GET /models)")
    target.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                        help="bearer token (default: $OPENAI_API_KEY, else none)")
    target.add_argument("--endpoint", choices=("chat", "completions"), default="chat",
                        help="/chat/completions (default) or /completions")
    target.add_argument("--temperature", type=float, default=0.0, help="(default 0)")
    target.add_argument("--ignore-eos", action="store_true",
                        help="send ignore_eos=true (vLLM/SGLang) so every reply runs to max tokens")
    target.add_argument("--extra-body", type=orjson.loads, default={},
                        help="JSON object merged into every request body")

    work = p.add_argument_group("workload")
    work.add_argument("--workload", choices=sorted(WORKLOADS), default="random")
    work.add_argument("--num-requests", type=int,
                      help="random: how many (default 100); others: cap on requests sent")
    work.add_argument("--input-len", type=LengthRange.parse, default=LengthRange(128, 128),
                      metavar="RANGE", help="words per user turn, random and multi-turn (default 128)")
    work.add_argument("--max-tokens", type=LengthRange.parse, default=LengthRange(128, 128),
                      metavar="RANGE", help="max_tokens per request (default 128)")
    work.add_argument("--num-groups", type=int, default=8, help="shared-prefix groups (default 8)")
    work.add_argument("--questions-per-group", type=int, default=16, help="(default 16)")
    work.add_argument("--prefix-len", type=int, default=1024,
                      help="words of shared system prompt (default 1024)")
    work.add_argument("--question-len", type=LengthRange.parse, default=LengthRange(32, 32),
                      metavar="RANGE", help="words per shared-prefix question (default 32)")
    work.add_argument("--order", choices=("random", "grouped", "interleaved"), default="random",
                      help="shared-prefix request order (default: seeded shuffle)")
    work.add_argument("--num-conversations", type=int, default=16, help="multi-turn (default 16)")
    work.add_argument("--turns", type=int, default=4, help="multi-turn turns per conversation (default 4)")
    work.add_argument("--seed", type=int, default=0, help="workload and arrival seed (default 0)")

    load = p.add_argument_group("load")
    mode = load.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int,
                      help=f"closed loop: requests in flight (default {DEFAULT_CONCURRENCY})")
    mode.add_argument("--request-rate", type=float,
                      help="open loop: Poisson arrivals per second (inf: all at once)")
    load.add_argument("--max-concurrency", type=int, help="open loop: cap on requests in flight")
    load.add_argument("--timeout", type=float,
                      help="stop after this many seconds and report partial results")
    load.add_argument("--warmup", type=int, default=1,
                      help="unmeasured requests sent first, one at a time (default 1)")

    out = p.add_argument_group("report")
    out.add_argument("--slo", type=Slo.parse,
                     help="goodput objectives in seconds, e.g. ttft=0.5,tpot=0.05,e2e=10")
    out.add_argument("--out", help="write the full result as JSON here")
    out.add_argument("--plot",
                     help="write a PNG of TTFT/TPOT/E2E distributions here (needs matplotlib)")
    out.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def build_workload(args: argparse.Namespace) -> Workload:
    if args.workload == "random":
        return RandomWorkload(args.num_requests or 100, args.input_len, args.max_tokens)
    if args.workload == "shared-prefix":
        return SharedPrefixWorkload(args.num_groups, args.questions_per_group, args.prefix_len,
                                    args.question_len, args.max_tokens, args.order)
    return MultiTurnWorkload(args.num_conversations, args.turns, args.input_len, args.max_tokens)


def build_load(args: argparse.Namespace) -> LoadConfig:
    if args.max_concurrency is not None and args.request_rate is None:
        raise ValueError("--max-concurrency is for --request-rate; a closed loop uses --concurrency")
    concurrency = None if args.request_rate is not None else (args.concurrency or DEFAULT_CONCURRENCY)
    return LoadConfig(concurrency, args.request_rate, args.max_concurrency,
                      args.num_requests, args.timeout, args.seed)


def warmup_workload(args: argparse.Namespace) -> list[Conversation]:
    # Own prompts, never the measured ones: a warm-up must not fill the prefix cache for them.
    workload = RandomWorkload(args.warmup, LengthRange(32, 32), LengthRange(16, 16))
    return workload.conversations(args.seed + 1_000_003)


class NoModel(Exception):
    pass


async def discover_model(client: Client) -> str:
    try:
        models = await client.list_models()
    except (RequestFailed, aiohttp.ClientError, ValueError) as exc:
        raise NoModel(f"cannot list models at {client.base_url}: {exc}") from exc
    if not models:
        raise NoModel(f"{client.base_url}/models lists no model")
    return models[0]


def progress_bar(total: int, disable: bool) -> tuple[tqdm, Callable[[RequestRecord], None]]:
    bar = tqdm(total=total, unit="req", file=sys.stderr, disable=disable, dynamic_ncols=True)
    errors = 0

    def on_done(record: RequestRecord) -> None:
        nonlocal errors
        bar.update(1)
        if record.outcome == "error":
            errors += 1
            bar.set_postfix(errors=errors, refresh=False)

    return bar, on_done


def config_json(args: argparse.Namespace, model: str, workload: Workload, load: LoadConfig,
                client_config: ClientConfig) -> dict[str, Any]:
    client = asdict(client_config)
    del client["api_key"]  # a result file gets shared; the key must not travel with it
    return {
        **client,
        "model": model,
        "workload": {"name": workload.name, **asdict(workload)},  # type: ignore[call-overload]
        "load": asdict(load),
        "warmup": args.warmup,
        "seed": args.seed,
        "slo": asdict(args.slo) if args.slo else None,
    }


def header_rows(args: argparse.Namespace, model: str, workload: Workload, load: LoadConfig,
                client_config: ClientConfig) -> list[tuple[str, str]]:
    if load.concurrency is not None:
        load_text = f"closed loop, concurrency {load.concurrency}"
    else:
        load_text = f"Poisson {load.request_rate:g} req/s"
        if load.max_concurrency is not None:
            load_text += f", max concurrency {load.max_concurrency}"
    return [("model", f"{model} ({client_config.endpoint}, {client_config.base_url})"),
            ("workload", f"{workload.name}, seed {args.seed}"), ("load", load_text)]


async def run(args: argparse.Namespace, workload: Workload, load: LoadConfig,
              client_config: ClientConfig) -> int:
    conversations = workload.conversations(args.seed)
    async with open_session() as session:
        client = Client(client_config, session)
        try:
            model = args.model or await discover_model(client)
        except NoModel as exc:
            print(f"omni-bench: {exc}; pass --model", file=sys.stderr)
            return 2
        bar, on_done = progress_bar(planned_requests(conversations, load.num_requests), args.no_progress)
        with bar:
            result = await Runner(client, model, load, on_done).run(conversations, warmup_workload(args))

    summary = summarize(result.records, result.duration_s, result.timed_out, args.slo)
    print(format_table(summary, header_rows(args, model, workload, load, client_config)))
    if args.out:
        config = config_json(args, model, workload, load, client_config)
        write_json(args.out, result_json(config, result, summary))
        print(f"wrote {args.out}")
    if args.plot:
        try:
            write_plot(args.plot, result.records)
            print(f"wrote {args.plot}")
        except ImportError:
            print("omni-bench: --plot needs matplotlib: pip install 'omni-serve[plot]' "
                  "(or pip install matplotlib); no plot written", file=sys.stderr)
    return 0 if summary.num_errors == 0 and summary.num_completed > 0 else 1


T = TypeVar("T")


def _run_loop(coro: Coroutine[Any, Any, T]) -> T:
    try:  # uvloop: less client CPU per request, which the server would otherwise lose
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def configs(args: argparse.Namespace) -> tuple[Workload, LoadConfig, ClientConfig]:
    """The run's configs from parsed flags; ValueError for a combination that cannot run."""
    if not isinstance(args.extra_body, dict):
        raise ValueError("--extra-body must be a JSON object")
    client_config = ClientConfig(args.base_url, args.api_key, args.endpoint, args.temperature,
                                 args.ignore_eos, args.extra_body)
    return build_workload(args), build_load(args), client_config


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        workload, load, client_config = configs(args)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        return _run_loop(run(args, workload, load, client_config))
    except KeyboardInterrupt:
        return 130
