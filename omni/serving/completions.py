"""POST /v1/completions without HTTP (the response: omni/http/handlers/completions.py): each
prompt (text or token ids, no media, no template) gets n choices, numbered prompt-major, held
to the request's output constraint; text out only."""

from __future__ import annotations

from omni.engines.generation import Generation, OutputOptions, choice_params, new_request_id, response_id
from omni.modalities.outputs.router import OutputRouter
from omni.serving.choice_constraints import ChoiceConstraints
from omni.serving.model import ModelRegistry
from omni.serving.prepared import Completion, check_serving, request_grammar
from omni.serving.prompt import completion_prompts
from omni.serving.requests import CompletionRequest
from omni.serving.sampling import sampling_params, truncate_prompt


async def completion(
    models: ModelRegistry, req: CompletionRequest, *, timeout: float | None, client_request_id: str | None = None
) -> Completion:
    model = models.get(req.model)
    prompts = await completion_prompts(model, req)  # no media: a malformed prompt is a 400 even while starting
    check_serving(model)
    model.pool.check_admission()
    grammar = await request_grammar(model, req)
    completion_id = new_request_id("cmpl")
    max_model_len = model.pool.max_model_len
    generations = []
    for p, full in enumerate(prompts):  # n choices per prompt: choice index = p * n + i
        ids = truncate_prompt(full, req, max_model_len)
        params = sampling_params(
            req,
            max_model_len=max_model_len,
            num_prompt_tokens=len(ids),
            tokenizer=model.tokenizer,
            max_logprobs=model.pool.config.llm.max_logprobs,
            scheduling_policy=model.pool.config.llm.scheduling_policy,
        )
        constraints = ChoiceConstraints(model, req, grammar, ids, params.max_tokens)
        generations += [
            Generation(
                model.pool,
                model.tokenizer,
                ids,
                choice_params(params, i),
                f"{completion_id}-{p * req.n + i}",
                output=OutputOptions(
                    req.stop,
                    req.skip_special_tokens,
                    include_stop_str_in_output=req.include_stop_str_in_output,
                    stop_token_ids=req.stop_token_ids,
                ),
                constraint=constraints.new(),
                cache_salt=req.cache_salt,
            )
            for i in range(req.n)
        ]
    outputs = [OutputRouter(g) for g in generations]
    completion_id = response_id("cmpl", client_request_id or req.request_id, completion_id)
    return Completion(id=completion_id, model=model, outputs=outputs, timeout=timeout)
