"""A scheduler output as the LLM worker's Step message: a pure function, so tests can drive a
runner with the real Scheduler exactly as the engine does."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from omni.shared import protocol
from scheduler.output import SchedulerOutput
from scheduler.request import Request, RequestId


def sampling_options(request: Request) -> protocol.SamplingOptions:
    """The worker's view of a request's sampling params (max_tokens, stops and EOS stay in the
    scheduler, which decides when a request ends; the worker sees the stop ids only to ban
    them during min_tokens, and so needs the request for its EOS ids)."""
    params = request.sampling_params
    stop_ids: list[int] = []
    if params.min_tokens > 0:
        # vLLM bans EOS here even with ignore_eos: min_tokens promises non-stop tokens.
        stop_ids = sorted(set(params.stop_token_ids) | request.eos_token_ids)
    return protocol.SamplingOptions(
        **{name: getattr(params, name) for name in SHARED_OPTIONS},
        logit_bias_token_ids=[t for t, _ in params.logit_bias],
        logit_bias_values=[b for _, b in params.logit_bias],
        allowed_token_ids=(
            None if params.allowed_token_ids is None else list(params.allowed_token_ids)
        ),
        bad_words_token_ids=[list(w) for w in params.bad_words_token_ids],
        min_tokens_stop_ids=stop_ids,
        speculate=request.speculate,
    )


# The worker's options that are the scheduler's params of the same name, as they are (plain
# values msgpack carries): a new sampling field needs no line here. The rest are reshaped above.
SHARED_OPTIONS = tuple(
    f.name
    for f in dataclasses.fields(protocol.SamplingOptions)
    if f.name
    not in {
        "logit_bias_token_ids",
        "logit_bias_values",
        "allowed_token_ids",
        "bad_words_token_ids",
        "min_tokens_stop_ids",
        "speculate",
    }
)


def step_message(
    output: SchedulerOutput,
    finished: Sequence[RequestId],
    token_masks: Sequence[protocol.TokenMask] = (),
    media_prefetch: Sequence[str] = (),
    *,
    masks_follow: bool = False,
) -> protocol.Step:
    """finished: every request that ended since the last Step sent (the output's own, plus
    those of outputs that had nothing to compute and so were never sent). token_masks: the
    grammar masks of the constrained requests that sample in this step. media_prefetch: the
    artifact keys of requests placed since the last step (the worker reads them ahead).
    masks_follow: the masks come in a StepMasks sent after the Step (the engine's way)."""
    new = [
        protocol.NewRequest(
            request_id=s.request.request_id,
            token_ids=s.request.all_token_ids,
            sampling=sampling_options(s.request),
            block_ids=list(s.block_ids),
            num_computed_tokens=s.num_computed_tokens,
            num_scheduled_tokens=s.num_scheduled_tokens,
            media=[protocol.MediaRef(m.key, m.offset, m.num_rows) for m in s.request.media],
        )
        for s in output.scheduled_new
    ]
    cached = [
        protocol.CachedRequest(
            request_id=c.request_id,
            new_block_ids=list(c.new_block_ids),
            num_computed_tokens=c.num_computed_tokens,
            num_scheduled_tokens=c.num_scheduled_tokens,
            resumed=c.resumed,
        )
        for c in output.scheduled_cached
    ]
    return protocol.Step(
        step_id=output.step_id,
        new_requests=new,
        cached_requests=cached,
        finished_request_ids=[str(r) for r in finished],
        token_masks=list(token_masks),
        media_prefetch=list(media_prefetch),
        masks_follow=masks_follow,
    )
