"""The body of POST /v1/images/edits: a multipart/form-data upload, as the official openai client
sends it (`client.images.edit`): the image a file part named `image` (several: parts named
`image[]`), the mask a file part named `mask`, every other value a text part.

OpenAI's fields: image, prompt, mask, model, n, size, response_format, output_format,
output_compression, stream and partial_images, as the generations API takes them
(omni/serving/requests/images.py); quality, background and input_fidelity only at their
defaults; what this decoder cannot make is a 400 naming the field: GIF and SVG output
(frame_count, frame_duration_ms, svg), a markup overlay (markup) and the planning effort
(complexity). The extensions the generations API takes: seed, num_inference_steps and
guidance_scale; and ours, step_cache_threshold. A field of neither is a 400 naming it, as on
the other endpoints.

Reading the body (omni/http/body.py read_image_edit_form) only collects the parts, bounded:
each image and the mask by --max-media-bytes, each text value by MAX_FIELD_BYTES, the whole
body by --max-request-bytes and --body-timeout. parse_image_edit_request reads the values into
ImageEditFields, where each field is declared once (common.py says how). That each image is an
image within the pixel limit, and the mask a PNG of the first image's size, is the lifecycle's
check (omni/serving/image_edits.py), as it decodes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from msgspec import Struct, field

from omni.errors import bad_request
from omni.serving.requests.common import (
    STRING,
    Priority,
    Refused,
    check_known,
    default_only,
    honoured,
    informational,
    known_fields,
    rejected,
)
from omni.serving.requests.fields import (
    MAX_SEED,
    MIN_SEED,
    convert,
    form_bool,
    form_value,
    missing,
    value_error,
)
from omni.serving.requests.images import (
    MAX_IMAGES,
    MAX_PARTIAL_IMAGES,
    MAX_PROMPT_CHARS,
    Compression,
    Guidance,
    OutputFormat,
    ResponseFormat,
    Seed,
    Size,
    StepCacheThreshold,
    Steps,
    check_file_options,
)
from omni.shared.media.image_sizes import parse_size

IMAGE_EDITS_PATH = "/v1/images/edits"
# The form's file parts: their bytes are not text.
FILE_PARTS = ("image", "mask")
_BINARY = {"format": "binary"}


class ImageEditFields(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The form's fields, each text read as its type."""

    image: Annotated[
        list[bytes],
        honoured(
            "the images to edit (png, jpeg or webp; parts named image[] for several): the first is edited, "
            "the others are seen as references",
            min_length=1,
            extra_json_schema={"items": {"type": "string", **_BINARY}},
        ),
    ]
    prompt: Annotated[
        str, honoured("the edit to make", max_length=MAX_PROMPT_CHARS, extra_json_schema={"pattern": r"\S"})
    ]
    mask: Annotated[
        bytes | None,
        honoured(
            "a PNG the first image's size: its fully transparent pixels mark the region to change; every other "
            "pixel is kept from the first image exactly",
            extra_json_schema=_BINARY,
        ),
    ] = None
    # A form has no null: a model left out is the only one that draws.
    model: Annotated[str, honoured("a served model with a vision decoder; left out: the only one")] = ""
    n: Annotated[int, honoured("how many edited images to draw", ge=1, le=MAX_IMAGES)] = 1
    size_sent: Annotated[
        Size | None, honoured("the edited image's size; auto: the first image's size")
    ] = field(name="size", default=None)
    response_format: Annotated[ResponseFormat, honoured("how the images are handed back")] = "url"
    output_format: Annotated[OutputFormat, honoured("the image file's format")] = "png"
    output_compression: Annotated[Compression | None, honoured("the jpeg or webp quality")] = None
    stream: Annotated[bool, honoured("server-sent events: partial images, then each image")] = False
    partial_images: Annotated[
        int,
        honoured(
            "previews per image from intermediate denoising steps; more than 0 needs stream", ge=0, le=MAX_PARTIAL_IMAGES
        ),
    ] = 0
    quality: Annotated[Refused, default_only("this server decides it", "auto", "standard")] = None
    background: Annotated[Refused, default_only("the images are opaque", "auto", "opaque")] = None
    input_fidelity: Annotated[Refused, default_only("the encoders read every input image one way", "low")] = None
    complexity: Annotated[Refused, rejected("the model plans every image one way")] = None
    frame_count: Annotated[Refused, rejected("the decoder draws no GIFs")] = None
    frame_duration_ms: Annotated[Refused, rejected("the decoder draws no GIFs")] = None
    markup: Annotated[Refused, rejected("send a mask: its transparent pixels mark the region to change")] = None
    svg: Annotated[Refused, rejected("the decoder draws no SVG")] = None
    safety_identifier: Annotated[
        str | None, informational("an end-user id for abuse monitoring; it changes no output", STRING)
    ] = None
    user: Annotated[str | None, informational("an end-user id for abuse monitoring; it changes no output", STRING)] = None
    seed: Annotated[Seed | None, honoured("image i is drawn with seed + i")] = None
    num_inference_steps: Annotated[Steps | None, honoured("denoising steps; default: the server's")] = None
    guidance_scale: Annotated[Guidance | None, honoured("classifier-free guidance; default: the checkpoint's")] = None
    step_cache_threshold: Annotated[
        StepCacheThreshold | None, honoured("the decoder's step cache; default: the server's --image-step-cache")
    ] = None
    priority: Priority = 0

    @property
    def size(self) -> tuple[int, int] | None:
        """None ("auto"): the first image's size; checked by parse_image_edit_request."""
        return None if self.size_sent is None else parse_size(self.size_sent)

    @property
    def model_name(self) -> str | None:
        return self.model or None


IMAGE_EDIT_FIELDS = known_fields(ImageEditFields)
# The fields a form gives as several parts; every other one is one text.
_LISTS = frozenset({"image"})
_BOOLS = ("stream",)


@dataclass(frozen=True, slots=True)
class ImageEditForm:
    """The parts of the body, not yet read as values: each field's values in the order sent,
    the files' bytes apart (`image[]` named `image`)."""

    fields: Mapping[str, Sequence[str]]
    files: Mapping[str, Sequence[bytes]]


def parse_image_edit_request(form: ImageEditForm) -> ImageEditFields:
    # A text part under a file's name ("image=https://...") is refused as the wrong type below.
    # Nested values come as `svg[model]`: the field is `svg`.
    values: dict[str, Any] = {}
    named: list[tuple[str, Sequence[str | bytes]]] = [*form.fields.items(), *form.files.items()]
    for name, parts in named:
        key = name.split("[", 1)[0]
        if key in values:
            raise bad_request(f"'{key}' is given both as a file and as a text; send it once.", param=key)
        values[key] = list(parts) if key in _LISTS else form_value(key, parts)
    check_known(values, IMAGE_EDIT_FIELDS, IMAGE_EDITS_PATH)
    for name in ("image", "prompt"):
        if name not in values:
            raise missing(name)
    for name in FILE_PARTS:
        if name in values and name not in form.files:
            raise value_error(name, f"send '{name}' as a file part (png, jpeg or webp), not as a text.")
    for name in _BOOLS:
        if name in values:
            values[name] = form_bool(values[name], name)
    # not strict: each text is read as its field's type ("2" an integer)
    req = convert(values, ImageEditFields, strict=False)
    if not req.prompt.strip():
        raise value_error("prompt", "must not be empty.")
    for i, data in enumerate(req.image):
        if not data:
            raise value_error("image", f"image {i} is empty.")
    if req.mask is not None and not req.mask:
        raise value_error("mask", "the mask is empty.")
    check_file_options(req.size_sent, req.output_format, req.output_compression)
    if req.partial_images and not req.stream:
        raise bad_request("'partial_images' needs 'stream' to be true.", param="partial_images")
    if req.seed is not None and req.seed > MAX_SEED:
        raise value_error("seed", f"must be between {MIN_SEED} and {MAX_SEED}, got {req.seed}.")
    return req
