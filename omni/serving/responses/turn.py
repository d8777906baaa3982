"""A Responses request as the chat turn the engine answers: the same prompt, tools, output
constraint and image drawing as POST /v1/chat/completions, so the two endpoints answer alike.

    instructions          -> a system message first (not carried to follow-ups, as OpenAI's)
    the stored turns      -> the messages of previous_response_id's conversation
    input items           -> messages: parts as chat's, function_call an assistant tool call,
                             function_call_output a tool message, reasoning the next assistant
                             turn's reasoning_content; an earlier image call is left out
    function tools        -> chat's tools; tool_choice alike
    image_generation      -> images allowed (modalities), drawn as b64 at the tool's size and
                             format; on a model whose dialect writes images as a call (the
                             reference's t2i_model_generation) that function is declared, and
                             tool_choice image_generation forces it; elsewhere forcing opens an
                             image span at once (a logit bias on its opening token) and the
                             turn ends after it
    text.format           -> response_format; reasoning.effort -> reasoning_effort

Errors that chat's parsing or the media layer raise name chat's fields; ParamMap names the
Responses field instead (`messages[2].content[1]` -> `input[1].content[1]`).
"""

from __future__ import annotations

import mimetypes
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from omni.errors import APIError, bad_request
from omni.modalities.outputs.image import IMAGE
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.requests import ChatCompletionRequest, parse_chat_completion_request
from omni.serving.requests.chat import TEXT_PART_SEPARATOR
from omni.serving.requests.fields import Json, value_error
from omni.serving.requests.responses import (
    ContentPart,
    FunctionCallItem,
    FunctionCallOutput,
    FunctionChoice,
    ImageGenerationCall,
    ImageGenerationChoice,
    ImageGenerationTool,
    InputAudioContent,
    InputFile,
    InputImage,
    InputText,
    Message,
    OutputText,
    Reasoning,
    Refusal,
    ResponseRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
)
from omni.shared.media.errors import MediaError
from omni.text.parsers.tool_grammar import T2I_TOOL

# The reference's drawing call, declared for the model when image_generation is a tool.
T2I_FUNCTION: dict[str, Json] = {
    "type": "function",
    "function": {
        "name": T2I_TOOL,
        "description": "Draw an image from the conversation.",
        "parameters": {
            "type": "object",
            "properties": {"discrete_image_token": {"type": "string"}},
            "required": ["discrete_image_token"],
        },
    },
}


@dataclass(slots=True)
class ParamMap:
    """Chat's param prefixes -> the Responses request's, longest first when applied."""

    prefixes: dict[str, str] = field(default_factory=dict)

    def name(self, param: str | None) -> str | None:
        if param is None:
            return None
        for chat in sorted(self.prefixes, key=len, reverse=True):
            if param == chat or param.startswith((chat + ".", chat + "[")):
                return self.prefixes[chat] + param[len(chat) :]
        return param

    def rename(self, exc: APIError | MediaError) -> APIError | MediaError:
        """The error with its param (and the param in its message) named as the client sent it."""
        if exc.param is not None:
            named = self.name(exc.param)
            if named is not None and named != exc.param:
                exc.message = exc.message.replace(exc.param, named)
                exc.args = (exc.message,)
                exc.param = named
        return exc


@dataclass(frozen=True, slots=True)
class ResponseTurn:
    chat: ChatCompletionRequest
    messages: list[dict[str, Json]]  # the conversation through this turn's input (no instructions)
    image_tool: ImageGenerationTool | None
    t2i_call: bool  # the model draws by calling T2I_TOOL: such a call is the image, not a function call
    params: ParamMap


def check_image_tool_model(models: ModelRegistry, req: ResponseRequest) -> None:
    """The image_generation tool's model, honoured as the images API's `model`: it names a
    served model (the same 404 when none has that name), and the one that draws. The turn's
    images are the answering model's own (its image span, its decoder), so it must be that one."""
    tool = req.image_tool
    if tool is None or tool.model is None:
        return
    param = f"tools[{req.tools.index(tool)}].model"
    try:
        drawer = models.get(tool.model)
    except APIError as exc:
        exc.param = param
        raise
    if drawer is not models.get(req.model):
        raise value_error(
            param, f"the model '{tool.model}' cannot draw in a response of '{req.model}': its own model draws its images."
        )


def response_turn(model: ServedModel, req: ResponseRequest, history: list[dict[str, Json]]) -> ResponseTurn:
    params = ParamMap()
    messages = list(history)
    new = _input_messages(req, params, offset=len(history) + (req.instructions is not None))
    messages += new
    system = [{"role": "system", "content": req.instructions}] if req.instructions is not None else []
    body: dict[str, Json] = {
        "model": req.model,
        "messages": system + messages,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "seed": req.seed,
        "priority": req.priority,
        "max_completion_tokens": req.max_output_tokens,
        "parallel_tool_calls": req.parallel_tool_calls,
    }
    params.prefixes["max_completion_tokens"] = "max_output_tokens"
    params.prefixes["response_format"] = "text.format"
    params.prefixes["response_format.json_schema"] = "text.format"
    if req.reasoning is not None:  # chat's reasoning_effort: one rule for both APIs
        body["reasoning_effort"] = req.reasoning.effort
    tools: list[dict[str, Json]] = []
    for i, tool in enumerate(req.tools):
        if isinstance(tool, ImageGenerationTool):
            continue
        fn: dict[str, Json] = {"name": tool.name, "parameters": tool.parameters or {"type": "object", "properties": {}}}
        if tool.description is not None:
            fn["description"] = tool.description
        if tool.strict is not None:
            fn["strict"] = tool.strict
        params.prefixes[f"tools[{len(tools)}].function"] = f"tools[{i}]"
        tools.append({"type": "function", "function": fn})
    image_tool = req.image_tool
    t2i_call = False
    choice: Json = req.tool_choice if isinstance(req.tool_choice, str) else None
    if isinstance(req.tool_choice, FunctionChoice):
        choice = {"type": "function", "function": {"name": req.tool_choice.name}}
    images = model.output(IMAGE)
    if image_tool is not None:
        if images is None:
            raise value_error(
                f"tools[{req.tools.index(image_tool)}]", f"the model '{model.name}' has no image decoder: it cannot draw."
            )
        body["modalities"] = ["text", "image"]
        body["image"] = _image_options(image_tool)
        forced = isinstance(req.tool_choice, ImageGenerationChoice) or (req.tool_choice == "required" and not tools)
        t2i_call = model.chat_format.tool_parser == "hyperclovax"
        if t2i_call:
            tools.append(T2I_FUNCTION)
            if forced:
                choice = {"type": "function", "function": {"name": T2I_TOOL}}
        elif forced:  # open the span at once; the turn is the image
            span = images.format.span_tokens
            body["logit_bias"] = {str(images.format.start_token_id): 100}
            body["max_completion_tokens"] = 1 + span
            choice = "none" if tools else None
    elif images is not None:
        body["modalities"] = ["text"]  # no image_generation tool: nothing is drawn
    if tools:
        body["tools"] = tools
        body["tool_choice"] = choice
    if req.text is not None and isinstance(req.text.format, TextFormatJsonSchema):
        fmt = req.text.format
        schema: dict[str, Json] = {"name": fmt.name, "schema": fmt.schema_}
        if fmt.strict is not None:
            schema["strict"] = fmt.strict
        body["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif req.text is not None and isinstance(req.text.format, TextFormatJsonObject):
        body["response_format"] = {"type": "json_object"}
    try:
        chat = parse_chat_completion_request(body)
    except APIError as exc:
        raise params.rename(exc) from None
    return ResponseTurn(chat, messages, image_tool, t2i_call, params)


def _image_options(tool: ImageGenerationTool) -> dict[str, Json]:
    options: dict[str, Json] = {"response_format": "b64_json", "output_format": tool.output_format}
    if tool.size != "auto":
        options["size"] = tool.size
    if tool.output_compression is not None:
        options["output_compression"] = tool.output_compression
    if tool.step_cache_threshold is not None:
        options["step_cache_threshold"] = tool.step_cache_threshold
    return options


def _input_messages(req: ResponseRequest, params: ParamMap, *, offset: int) -> list[dict[str, Json]]:
    """The input items as chat messages; offset: the chat index of the first."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}] if req.input else []
    out: list[dict[str, Json]] = []
    reasoning: str | None = None
    for i, item in enumerate(req.input):
        param = f"input[{i}]"
        if isinstance(item, Message):
            message: dict[str, Json] = {"role": item.role, "content": _content(item, param)}
            if item.role == "assistant" and reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant" and reasoning is None:  # the same turn's
                calls = last.setdefault("tool_calls", [])
                calls.append(call)
                params.prefixes[f"messages[{offset + len(out) - 1}].tool_calls[{len(calls) - 1}]"] = param
                continue
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            if reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
            params.prefixes[f"messages[{offset + len(out)}].tool_calls[0]"] = param
        elif isinstance(item, FunctionCallOutput):
            output = item.output if isinstance(item.output, str) else _joined_text(item.output)
            message = {"role": "tool", "tool_call_id": item.call_id, "content": output}
        elif isinstance(item, Reasoning):
            texts = [s.text for s in item.summary] + [c.text for c in item.content or ()]
            reasoning = "\n".join(texts)
            continue
        else:
            assert isinstance(item, ImageGenerationCall)
            continue  # an earlier drawing: its codes are not kept, the turn is its text
        params.prefixes[f"messages[{offset + len(out)}]"] = param
        out.append(message)
    return out


def _joined_text(parts: Sequence[ContentPart]) -> str:
    """The text parts' text, joined as chat joins a message's text parts."""
    return TEXT_PART_SEPARATOR.join(_text(p) for p in parts if isinstance(p, InputText | OutputText | Refusal))


def _text(part: ContentPart) -> str:
    if isinstance(part, InputText | OutputText):
        return part.text
    if isinstance(part, Refusal):
        return part.refusal
    return ""


def _content(item: Message, param: str) -> Json:
    if isinstance(item.content, str):
        return item.content
    if item.role != "user":  # text only, as chat's
        for j, part in enumerate(item.content):
            if isinstance(part, InputImage | InputAudioContent | InputFile):
                raise value_error(f"{param}.content[{j}]", f"a {item.role} message may only contain text parts.")
        return _joined_text(item.content)
    return [_part(p, f"{param}.content[{j}]") for j, p in enumerate(item.content)]


def _part(part: ContentPart, param: str) -> dict[str, Json]:
    if isinstance(part, InputText | OutputText | Refusal):
        return {"type": "text", "text": _text(part)}
    if isinstance(part, InputImage):
        if part.image_url is None:
            raise _no_files(param, "image_url")
        detail = None if part.detail in ("auto", "original") else part.detail
        return {"type": "image_url", "image_url": {"url": part.image_url, "detail": detail}}
    if isinstance(part, InputAudioContent):
        return {"type": "input_audio", "input_audio": {"data": part.input_audio.data, "format": part.input_audio.format}}
    return {"type": "image_url", "image_url": {"url": _file_url(part, param)}}


def _file_url(part: InputFile, param: str) -> str:
    """An input_file as an image's URL: its data (a data URL, or base64 typed from its name)
    or its file_url. Only images are read."""
    if part.file_url is not None:
        return part.file_url
    if part.file_data is None:
        raise _no_files(param, "file_data")
    data = part.file_data
    if data.startswith("data:"):
        media_type = data[5:].split(";", 1)[0].split(",", 1)[0]
    else:
        media_type = (mimetypes.guess_type(part.filename or "")[0]) or "image/png"
        data = f"data:{media_type};base64,{data}"
    if not media_type.startswith("image/"):
        raise value_error(f"{param}.file_data", f"only image files are read, got '{media_type}'.")
    return data


def _no_files(param: str, needed: str) -> APIError:
    return bad_request(
        f"'{param}.file_id' needs a files API, which this server does not have; send '{needed}'.",
        param=f"{param}.file_id",
        code="unsupported_parameter",
    )


def assistant_message(content: str, reasoning: str, calls: list[dict[str, Any]]) -> dict[str, Json]:
    """This turn's answer as the chat message a follow-up renders."""
    message: dict[str, Json] = {"role": "assistant", "content": content or (None if calls else "")}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = reasoning
    return message
