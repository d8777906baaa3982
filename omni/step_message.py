"""A scheduler output as the LLM worker's Step message: a pure function, so tests can drive a
runner with the real Scheduler exactly as the engine does."""

from __future__ import annotations

from collections.abc import Sequence

from omni import protocol
from scheduler.output import SchedulerOutput
from scheduler.request import RequestId, SamplingParams


def sampling_options(params: SamplingParams) -> protocol.SamplingOptions:
    """The worker's view of a request's sampling params (max_tokens, stops and EOS stay in the
    scheduler, which decides when a request ends)."""
    return protocol.SamplingOptions(
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        seed=params.seed,
        logprobs=params.logprobs,
    )


def step_message(
    output: SchedulerOutput,
    finished: Sequence[RequestId],
    token_masks: Sequence[protocol.TokenMask] = (),
) -> protocol.Step:
    """finished: every request that ended since the last Step sent (the output's own, plus
    those of outputs that had nothing to compute and so were never sent). token_masks: the
    grammar masks of the constrained requests that sample in this step."""
    new = [
        protocol.NewRequest(
            request_id=s.request.request_id,
            token_ids=s.request.all_token_ids,
            sampling=sampling_options(s.request.sampling_params),
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
    )
