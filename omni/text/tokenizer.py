"""The model's text tokenizer as the server process uses it: encode, chat template, decode.

Loaded as transformers' fast tokenizer class directly, not through AutoTokenizer: in
transformers 5, AutoTokenizer imports the model configuration code and with it torch, which
the server process never imports. Any model with a tokenizer.json loads this way, and a GGUF
file (from_gguf) from its metadata, by transformers' own GGUF tokenizer builder (its file
reader imports torch: the metadata is read with the gguf package instead).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import jinja2
import tokenizers
from tokenizers import decoders
from transformers import PreTrainedTokenizerFast
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from omni.shared.gguf_file import GgufFile, is_gguf
from omni.text.chat_encoder import ChatEncoder
from omni.text.chat_template import ChatTemplate

# The reference model's prompt format, for a checkpoint that ships no template of its own but
# has the reference's vocabulary (the published HyperCLOVAX-SEED-Omni-8B download is one: its
# own deployment passes this layout with --chat-template). omni-serve's own rendering of it.
REFERENCE_TEMPLATE = Path(__file__).with_name("templates") / "hyperclovax_omni.jinja"
# The tokens whose presence says the vocabulary is the reference's: its turn markers and the
# media header every input item starts with.
REFERENCE_MARKERS = ("<|im_start|>", "<|im_end|>", "<|mime_start|>", "<|mime_end|>")


class TemplateMessage(Protocol):
    """A parsed chat message (omni.serving.requests.ChatMessage) that can render itself."""

    def to_template_dict(self) -> dict[str, Any]: ...


# OpenAI-style dicts, or parsed messages.
Message = Mapping[str, Any] | TemplateMessage


def _byte_level_alphabet() -> dict[str, int]:
    """The GPT-2 byte-level map from a token's printable characters back to its bytes."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + n)
            n += 1
    return {c: b for b, c in chars.items()}


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


# How many UTF-8 bytes of text one normalized byte may stand for, per normalizer. Composition
# shrinks text (a Hangul syllable from three jamo is 9 bytes to 3; Greek with three combining
# marks, 8 to 3); 4 leaves room. A normalizer not listed (Strip, Replace, Precompiled, ...) may
# delete any amount of text, so a tokenizer with one has no length bound.
_SHRINK: dict[str | None, int] = {None: 1, "NFC": 4, "NFKC": 4, "NFD": 1, "NFKD": 1}


def _shrink_factor(normalizer: Any) -> int | None:
    if normalizer is None:
        return 1
    kind = normalizer.get("type")
    if kind == "Sequence":
        factor = 1
        for inner in normalizer.get("normalizers", []):
            f = _shrink_factor(inner)
            if f is None:
                return None
            factor *= f
        return factor
    return _SHRINK.get(kind)


def _is_byte_level(pre_tokenizer: Any) -> bool:
    if pre_tokenizer is None:
        return False
    if pre_tokenizer.get("type") == "Sequence":
        return any(_is_byte_level(p) for p in pre_tokenizer.get("pretokenizers", []))
    return bool(pre_tokenizer.get("type") == "ByteLevel")


def _eos_ids(value: Any) -> frozenset[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return frozenset((value,))
    if isinstance(value, list):
        return frozenset(v for v in value if isinstance(v, int) and not isinstance(v, bool))
    return frozenset()


def reference_chat_template() -> str:
    """The reference model's prompt format (omni/text/templates/hyperclovax_omni.jinja)."""
    return REFERENCE_TEMPLATE.read_text(encoding="utf-8")


class TextTokenizer:
    def __init__(
        self,
        hf_tokenizer: PreTrainedTokenizerBase,
        eos_token_ids: frozenset[int],
        model_vocab_size: int | None = None,
        default_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.hf_tokenizer = hf_tokenizer
        # The checkpoint's chat template variables unless a render sets them (generation_config.json's
        # default_chat_template_kwargs, as vLLM's --default-chat-template-kwargs gives them).
        self.default_template_kwargs: Mapping[str, Any] = dict(default_template_kwargs or {})
        # The model's config.json vocab_size: the rows of its embedding and logits (None: unknown).
        self.model_vocab_size = model_vocab_size
        # The Rust tokenizer behind the transformers wrapper, for the fast paths.
        self.backend: tokenizers.Tokenizer = hf_tokenizer.backend_tokenizer
        self.eos_token_ids = eos_token_ids
        self.chat_encoder = ChatEncoder(self.backend)
        self.chat_template = ChatTemplate(hf_tokenizer)
        self._keep_tables: dict[frozenset[int], list[bytes]] = {}

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> TextTokenizer:
        """From a HF model directory, or a GGUF file (the model path a GGUF checkpoint has)."""
        model_dir = Path(model_dir)
        if is_gguf(model_dir):
            return cls.from_gguf(model_dir)
        if not (model_dir / "tokenizer.json").is_file():
            raise ValueError(f"{model_dir}: no tokenizer.json (a fast tokenizer is required)")
        hf = PreTrainedTokenizerFast.from_pretrained(
            model_dir, local_files_only=True, trust_remote_code=False
        )
        if not hf.chat_template:
            template_file = model_dir / "chat_template.jinja"
            config_template = _read_json(model_dir / "tokenizer_config.json").get("chat_template")
            if template_file.is_file():
                hf.chat_template = template_file.read_text()
            elif isinstance(config_template, str):
                hf.chat_template = config_template
            elif all(hf.backend_tokenizer.token_to_id(t) is not None for t in REFERENCE_MARKERS):
                hf.chat_template = reference_chat_template()
        generation = _read_json(model_dir / "generation_config.json")
        eos = _eos_ids(generation.get("eos_token_id"))
        template_kwargs = generation.get("default_chat_template_kwargs")
        if template_kwargs is not None and not isinstance(template_kwargs, dict):
            raise ValueError(f"{model_dir}: generation_config.json's default_chat_template_kwargs is not an object")
        config = _read_json(model_dir / "config.json")
        text_config = config.get("text_config")
        if not isinstance(text_config, dict):
            text_config = {}  # the published omni checkpoint's LLM nests its config there
        if not eos:
            eos = _eos_ids(config.get("eos_token_id")) or _eos_ids(text_config.get("eos_token_id"))
        if not eos and hf.eos_token_id is not None:
            eos = frozenset((hf.eos_token_id,))
        model_vocab = config.get("vocab_size", text_config.get("vocab_size"))
        valid = isinstance(model_vocab, int) and not isinstance(model_vocab, bool) and model_vocab > 0
        return cls(hf, eos, model_vocab if valid else None, template_kwargs)

    @classmethod
    def from_gguf(cls, path: str | Path) -> TextTokenizer:
        """The tokenizer, chat template and end-of-generation ids a GGUF file's metadata gives.

        As transformers' PreTrainedTokenizerFast.from_pretrained(dir, gguf_file=...) builds it:
        get_gguf_tokenizer's grouping of the tokenizer.* keys (done here on the gguf package's
        reader) and convert_gguf_tokenizer. The stop ids are llama.cpp's end-of-generation
        tokens the file names: its eos, and its end-of-turn and end-of-message when it has them.
        """
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            GGUF_TOKENIZER_MAPPING,
            convert_gguf_tokenizer,
        )

        gguf = GgufFile(Path(path))
        meta = gguf.fields
        if not isinstance(meta.get("tokenizer.ggml.tokens"), list):
            raise ValueError(f"{path}: the GGUF file has no tokenizer (no tokenizer.ggml.tokens)")  # noqa: TRY004
        grouped = {
            group: {name: meta[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in meta}
            for group, renames in GGUF_TOKENIZER_MAPPING.items()
        }
        tokenizer, config = grouped["tokenizer"], grouped["tokenizer_config"]
        if tokenizer.get("tokenizer_type") == "llama":
            config.setdefault("add_bos_token", True)  # llama.cpp's default for sentencepiece files
        tokens = tokenizer["tokens"]
        for name, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
            token_id = meta.get(f"tokenizer.ggml.{key}_token_id")
            config[f"{name}_token"] = tokens[token_id] if isinstance(token_id, int) else None
        try:
            backend, extra = convert_gguf_tokenizer(gguf.architecture, tokenizer)
        except (ValueError, KeyError) as e:
            raise ValueError(f"{path}: cannot build a tokenizer from the GGUF metadata ({e})") from None
        hf = PreTrainedTokenizerFast(tokenizer_object=backend, **config, **extra)
        stops = (meta.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom"))
        return cls(hf, frozenset(i for i in stops if isinstance(i, int) and not isinstance(i, bool)))

    @cached_property
    def vocab_size(self) -> int:
        """Number of token ids, added and special tokens included (len(hf_tokenizer))."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @cached_property
    def num_token_ids(self) -> int:
        """The token ids a request may name: [0, num_token_ids) are in both the tokenizer and
        the model. An id past the model's rows indexes past its embedding or logits: an
        IndexError on the CPU, a sticky device-side assert on a GPU (review A3)."""
        if self.model_vocab_size is None:
            return self.vocab_size
        return min(self.vocab_size, self.model_vocab_size)

    @cached_property
    def special_token_ids(self) -> frozenset[int]:
        return frozenset(
            i for i, t in self.backend.get_added_tokens_decoder().items() if t.special
        )

    @cached_property
    def max_chars_per_token(self) -> int | None:
        """The most characters of text one token can stand for, when there is such a bound.

        Byte-level BPE writes every byte of the (normalized) text with tokens of at most L
        bytes each (L: the longest vocabulary entry, added tokens included), so a text of B
        bytes is at least B / L tokens. A character is at least one byte, and a normalizer
        shrinks bytes at most F times, so C characters are at least C / (L * F) tokens. No
        bound exists for other models (an unknown token may stand for any run of text), for
        an added token that strips the whitespace around it, or for a normalizer that deletes.
        """
        spec = json.loads(self.backend.to_str())
        model = spec.get("model") or {}
        if model.get("type") != "BPE" or not _is_byte_level(spec.get("pre_tokenizer")):
            return None
        if any(t.lstrip or t.rstrip for t in self.backend.get_added_tokens_decoder().values()):
            return None
        shrink = _shrink_factor(spec.get("normalizer"))
        if shrink is None:
            return None
        return max(len(b) for b in self._token_bytes_all) * shrink

    def min_num_tokens(self, text: str) -> int:
        """A lower bound on len(encode(text)) that costs no tokenizing (0 when none is known)."""
        per_token = self.max_chars_per_token
        return 0 if per_token is None else -(-len(text) // per_token)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        # The batch call releases the GIL while it encodes (encode() holds it throughout), so
        # a long text encoding in a worker thread leaves the event loop running.
        return self.backend.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        # The Rust decode, without transformers' clean-up of spaces: the incremental
        # detokenizer reproduces exactly this.
        return self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def render_chat(
        self,
        messages: Sequence[Message],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text: the model's chat template (or chat_template) over the messages.
        continue_final_message leaves the last message open, so the reply continues it."""
        template = chat_template or self.hf_tokenizer.chat_template
        if not template:
            raise ValueError("the model has no chat template")
        try:
            conversation = [
                m if isinstance(m, Mapping) else m.to_template_dict() for m in messages
            ]
            # apply_chat_template(..., tokenize=False), with the large joins outside the GIL.
            return self.chat_template.render(
                conversation,
                tools=[dict(t) for t in tools] if tools else None,
                documents=[dict(d) for d in documents] if documents else None,
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                **{**self.default_template_kwargs, **template_kwargs},
            )
        except (jinja2.TemplateError, TypeError, KeyError, AttributeError, ValueError) as e:
            # TemplateError covers the template's own raise_exception(...); ValueError,
            # transformers' own refusals (e.g. a final message it cannot continue).
            raise ValueError(f"could not apply the chat template to the messages: {e}") from e

    def render_prompt(
        self,
        messages: Sequence[Message],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        **options: Any,
    ) -> str:
        """render_chat over the client's values with their special tokens escaped: the text
        encode_prompt takes (options as render_chat's; the template itself is not escaped)."""
        escape = self.chat_encoder.escape
        conversation = [m if isinstance(m, Mapping) else m.to_template_dict() for m in messages]
        return self.render_chat(
            escape(conversation),
            tools=escape(list(tools)) if tools else None,
            documents=escape(list(documents)) if documents else None,
            chat_template=chat_template,
            **escape(options),
        )

    def encode_prompt(self, text: str) -> list[int]:
        """render_prompt's text as token ids: the template's special tokens are special, every
        special token string the client wrote is plain text."""
        # The template writes any BOS itself: nothing is added here.
        return self.chat_encoder.encode(text)

    def apply_chat_template(self, messages: Sequence[Message], **options: Any) -> list[int]:
        """The chat prompt's token ids (options as render_chat's)."""
        return self.encode_prompt(self.render_prompt(messages, **options))

    @property
    def is_byte_level(self) -> bool:
        return isinstance(self.backend.decoder, decoders.ByteLevel)

    def token_bytes(
        self, *, skip_special_tokens: bool, keep_special: frozenset[int] = frozenset()
    ) -> list[bytes]:
        """Each id's bytes as a byte-level decoder emits them (b"" for skipped specials).

        decode(ids) == b"".join(table[i] for i in ids).decode("utf-8", "replace") holds
        for byte-level tokenizers; the incremental detokenizer relies on it. keep_special
        names special tokens written out even when the others are skipped (the markup a tool
        call or reasoning parser reads, such as <tool_call> and <think>).
        """
        if not self.is_byte_level:
            raise ValueError("token_bytes needs a byte-level tokenizer")
        if not skip_special_tokens:
            return self._token_bytes_all
        if not keep_special:
            return self._token_bytes_skip_special
        table = self._keep_tables.get(keep_special)
        if table is None:
            table = list(self._token_bytes_skip_special)
            full = self._token_bytes_all
            for i in keep_special:
                if 0 <= i < len(table):
                    table[i] = full[i]
            self._keep_tables[keep_special] = table
        return table

    def skipped_special_ids(self, keep_special: frozenset[int] = frozenset()) -> frozenset[int]:
        """The ids a decode that skips special tokens drops, keep_special excepted."""
        return self.special_token_ids - keep_special

    def special_ids(self, *tokens: str) -> frozenset[int]:
        """The ids of those of these tokens the vocabulary has."""
        ids = (self.token_to_id(t) for t in tokens)
        return frozenset(i for i in ids if i is not None)

    @cached_property
    def _token_bytes_all(self) -> list[bytes]:
        alphabet = _byte_level_alphabet()
        table: list[bytes] = []
        # Added tokens may leave gaps in the ids: size the table by the largest one.
        size = max(
            self.backend.get_vocab_size(with_added_tokens=True),
            max(self.backend.get_added_tokens_decoder(), default=-1) + 1,
        )
        for i in range(size):
            token = self.backend.id_to_token(i)
            if token is None:
                table.append(b"")
            elif all(c in alphabet for c in token):
                table.append(bytes(alphabet[c] for c in token))
            else:
                # The Rust ByteLevel decoder keeps such a token's UTF-8 as it is.
                table.append(token.encode())
        return table

    @cached_property
    def _token_bytes_skip_special(self) -> list[bytes]:
        table = list(self._token_bytes_all)
        for i in self.special_token_ids:
            if i < len(table):
                table[i] = b""
        return table
