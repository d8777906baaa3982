"""The bodies of POST /tokenize and POST /detokenize: vLLM's TokenizeCompletionRequest (a text
`prompt`), TokenizeChatRequest (`messages`, with the chat fields that shape the rendered prompt,
which the chat completion's parser reads) and DetokenizeRequest. Each field is declared once
(common.py says how)."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Struct

from omni.errors import bad_request
from omni.serving.requests.common import (
    Refused,
    TokenIds,
    check_known,
    default_only,
    honoured,
    known_fields,
)
from omni.serving.requests.fields import Body, convert, missing

TOKENIZE_PATH = "/tokenize"
DETOKENIZE_PATH = "/detokenize"

Model = Annotated[str | None, honoured("a served model; null: the only one")]
ReturnTokenStrs = Annotated[bool, honoured("also answer each token's string (token_strs)")]
# A chat field, read by the chat completion's parser (its schema is the chat request's).
ChatField = Annotated[Any, honoured("as in a chat completion")]


class TokenizeCompletionRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    prompt: Annotated[str, honoured("the text to tokenize")]
    model: Model = None
    add_special_tokens: Annotated[
        bool, honoured("add the tokenizer's special tokens (e.g. BOS); default true")
    ] = True  # vLLM's default
    return_token_strs: ReturnTokenStrs = False


class TokenizeChatRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Rendered as a chat completion renders them; media parts are a 400 for now."""

    messages: ChatField
    model: Model = None
    # The template writes the special tokens a chat prompt has; adding a BOS on top of it
    # would count a prompt no chat completion runs.
    add_special_tokens: Annotated[Refused, default_only("the chat template writes them", False)] = None
    return_token_strs: ReturnTokenStrs = False
    tools: ChatField = None
    chat_template: ChatField = None
    chat_template_kwargs: ChatField = None
    add_generation_prompt: ChatField = None
    continue_final_message: ChatField = None
    documents: ChatField = None

    def chat_body(self, model: str) -> dict[str, Any]:
        """The chat completion body whose prompt this counts."""
        body = {name: getattr(self, name) for name in TEMPLATE_FIELDS}
        return {"model": model, **{k: v for k, v in body.items() if v is not None}}


class DetokenizeRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    tokens: Annotated[TokenIds, honoured("token ids, each in the model's vocabulary")]
    model: Model = None


PROMPT_FIELDS = known_fields(TokenizeCompletionRequest)
CHAT_FIELDS = known_fields(TokenizeChatRequest)
DETOKENIZE_FIELDS = known_fields(DetokenizeRequest)
# The chat fields that shape the rendered prompt: passed to the chat completion parser as they are.
TEMPLATE_FIELDS = tuple(name for name, f in CHAT_FIELDS.items() if f.reason == "as in a chat completion")


def parse_tokenize_request(body: Body) -> TokenizeCompletionRequest | TokenizeChatRequest:
    if "messages" in body and "prompt" in body:
        raise bad_request("Give either 'prompt' or 'messages', not both.", param="prompt")
    if "messages" in body:
        check_known(body, CHAT_FIELDS, TOKENIZE_PATH, list_fields=True)
        return convert(body, TokenizeChatRequest)
    check_known(body, PROMPT_FIELDS, TOKENIZE_PATH, list_fields=True)
    if body.get("prompt") is None:
        raise missing("prompt")  # or messages: the chat form
    return convert(body, TokenizeCompletionRequest)


def parse_detokenize_request(body: Body) -> DetokenizeRequest:
    check_known(body, DETOKENIZE_FIELDS, DETOKENIZE_PATH, list_fields=True)
    return convert(body, DetokenizeRequest)
