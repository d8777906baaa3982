"""A deterministic tiny byte-level BPE tokenizer in the reference model's on-disk layout.

Tests and tiny checkpoints use it in place of the real tokenizer, which cannot be downloaded
here. It has the reference model's special tokens and a few discrete code tokens, and is
trained on a small embedded corpus so that ordinary text takes a few tokens per word while
CJK characters and emoji still span several byte tokens. Building twice gives byte-identical
files. This module imports neither torch nor transformers.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BPE_VOCAB_SIZE = 1280  # byte alphabet + merges; special and code tokens come on top
MODEL_MAX_LENGTH = 8192

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

# Marker tokens of the reference model (REFERENCE_MODEL.md), in a fixed order: their ids
# follow the BPE vocabulary in this order, then the vision codes, then the audio codes.
SPECIAL_TOKENS: tuple[str, ...] = (
    ENDOFTEXT,
    IM_START,
    IM_END,
    "<|mime_start|>",
    "<|mime_end|>",
    "<|image_start|>",
    "<|IMAGE_PAD|>",
    "<|image_end|>",
    "<|discrete_image_start|>",
    "<|DISCRETE_IMAGE_PAD|>",
    "<|discrete_image_end|>",
    "<|video_start|>",
    "<|VIDEO_PAD|>",
    "<|video_end|>",
    "<|audio_start|>",
    "<|AUDIO_PAD|>",
    "<|audio_end|>",
    "<|discrete_audio_start|>",
    "<|DISCRETE_AUDIO_PAD|>",
    "<|discrete_audio_end|>",
    "<|vision_eol|>",
    "<|vision_eof|>",
    "<|vision_token|>",
    "<|vision_ratio_1:1|>",
    "<|vision_ratio_4:3|>",
    "<|vision_ratio_3:4|>",
    "<|vision_ratio_16:9|>",
    "<|vision_ratio_9:16|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
)


# The reference's further markers (PUBLISHED_CHECKPOINT.md section 7): the duration line of its
# prompt format (omni/text/templates/hyperclovax_omni.jinja), tool results, and the markup of a
# spoken answer. Appended after the code tokens, so every earlier id stays what it was.
REFERENCE_TOKENS: tuple[str, ...] = (
    "<|video_aux_start|>",
    "<|video_aux_end|>",
    "<|audio_aux_start|>",
    "<|audio_aux_end|>",
    "<tool_response>",
    "</tool_response>",
    "<user_transcript>",
    "</user_transcript>",
    "<assistant_transcript>",
    "</assistant_transcript>",
    "<audio_decoder_call>",
    "</audio_decoder_call>",
    "<speaker_info>",
    "</speaker_info>",
)


def vision_code_token(code: int) -> str:
    return f"<|vision{code:05d}|>"


def audio_code_token(unit: int) -> str:
    return f"<|audio{unit:04d}|>"


# ChatML, in the reference model's dialect. Content is a string, a list of parts or none (an
# assistant turn with tool calls). Media parts arrive as {"type": "image" | "video" | "audio",
# "id": ...} (transformers' multimodal convention) and render as the reference model does: a
# mime header, then one placeholder per representation, which the server expands
# (omni/modalities/inputs/placeholders.py).
# Tools: their JSON schemas go into a system turn (after the client's own system message, if
# it is first), and an assistant's calls render as the model writes them:
#   <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>...</tool_call>
# (a string V as it is, anything else as JSON); a tool's result is a `tool` turn.
# Reasoning: the model may open <think> itself; `skip_reasoning` (the reference template's
# switch) or `enable_thinking=false` (Qwen3's) ends the prompt with an empty, closed block.
CHAT_TEMPLATE = """\
{%- macro render_content(content) -%}
{%- if content is string -%}
{{- content -}}
{%- elif content is iterable -%}
{%- for part in content -%}
{%- if part['type'] == 'text' -%}
{{- part['text'] -}}
{%- elif part['type'] in ('image', 'video', 'audio') -%}
{{- '<|mime_start|>{"id": "' + part['id'] | string + '", "type": "' + part['type'] + '"}<|mime_end|>' -}}
{%- if part['type'] == 'image' -%}
{{- '<|discrete_image_start|><|DISCRETE_IMAGE_PAD|><|discrete_image_end|>' -}}
{{- '<|image_start|><|IMAGE_PAD|><|image_end|>' -}}
{%- elif part['type'] == 'video' -%}
{{- '<|video_start|><|VIDEO_PAD|><|video_end|>' -}}
{%- else -%}
{{- '<|discrete_audio_start|><|DISCRETE_AUDIO_PAD|><|discrete_audio_end|>' -}}
{{- '<|audio_start|><|AUDIO_PAD|><|audio_end|>' -}}
{%- endif -%}
{%- else -%}
{{- raise_exception('unsupported content part type: ' + part['type'] | string) -}}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(first=0) -%}
{%- if tools -%}
{%- if messages and messages[0]['role'] == 'system' -%}
{{- '<|im_start|>system\\n' + render_content(messages[0]['content']) + '\\n\\n' -}}
{%- set ns.first = 1 -%}
{%- else -%}
{{- '<|im_start|>system\\n' -}}
{%- endif -%}
{{- '# Tools\\nYou may call these functions:\\n' -}}
{%- for tool in tools -%}
{{- (tool['function'] if tool['function'] is defined else tool) | tojson + '\\n' -}}
{%- endfor -%}
{{- 'To call one, write <tool_call>NAME<arg_key>ARGUMENT</arg_key><arg_value>VALUE</arg_value></tool_call>.' -}}
{{- '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages[ns.first:] -%}
{{- '<|im_start|>' + message['role'] + '\\n' -}}
{{- render_content(message['content']) -}}
{%- if message['role'] == 'assistant' and message['tool_calls'] is defined and message['tool_calls'] -%}
{%- for call in message['tool_calls'] -%}
{%- set fn = call['function'] if call['function'] is defined else call -%}
{{- '<tool_call>' + fn['name'] -}}
{%- for key, value in (fn['arguments'] or {}).items() -%}
{{- '<arg_key>' + key + '</arg_key><arg_value>' + (value if value is string else value | tojson) + '</arg_value>' -}}
{%- endfor -%}
{{- '</tool_call>' -}}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if skip_reasoning is true or enable_thinking is false -%}
{{- '<think>\\n\\n</think>\\n\\n' -}}
{%- endif -%}
{%- endif -%}
"""

# Varied enough that common English words, code keywords and accented words merge into few
# tokens, while rarer CJK characters and emoji stay split into byte tokens.
CORPUS = """\
The quick brown fox jumps over the lazy dog. A serving system answers many requests at once:
it batches the work of every request into one step, so the accelerator stays busy while each
client still sees its own stream of tokens. When the memory for the key-value cache runs out,
the scheduler preempts the youngest request and recomputes it later.
Once upon a time, in a small village by the sea, there lived an old fisherman and his wife.
Every morning he rowed out before sunrise, and every evening he came home with a basket of fish.
"What a beautiful day," she said. "Shall we walk to the market and buy some bread?"
He smiled, took his hat, and they went out together into the bright afternoon light.
Numbers and dates: 0 1 2 3 4 5 6 7 8 9 10 42 100 256 1024 2048 3.14159 2.71828 1,000,000
on 2024-05-17 at 12:30:45 UTC; the price was $19.99 (about 18.50 EUR) or 27,000 KRW.
Questions? Answers! Lists: apples, oranges, bananas; items #1, #2 and #3 -- done.
Images, audio and video are encoded into embeddings; the language model reads them and writes
text, image codes or audio units. A decoder turns image codes into pixels and audio units into
a waveform at twenty-four kilohertz. Please describe the picture in one sentence.
Summarize the following article in three bullet points, then translate it into French.

def fibonacci(n: int) -> list[int]:
    \"\"\"Return the first n Fibonacci numbers.\"\"\"
    result = []
    a, b = 0, 1
    for _ in range(n):
        result.append(a)
        a, b = b, a + b
    return result


class Scheduler:
    def __init__(self, max_num_seqs: int = 256) -> None:
        self.waiting: list[Request] = []
        self.running: list[Request] = []

    def schedule(self) -> dict[str, int]:
        if not self.waiting:
            return {}
        return {"num_scheduled_tokens": len(self.running)}

for (int i = 0; i < n; ++i) { sum += x[i] * y[i]; }
const response = await fetch("/v1/chat/completions", { method: "POST", body });
SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY id;
{"model": "omni", "messages": [{"role": "user", "content": "Hello!"}], "stream": true}
$ curl -s http://localhost:8000/v1/models | jq .data[0].id

Français : Le café est très chaud, mais la crème brûlée est déjà prête. Où est l'hôtel ?
Deutsch: Über den Bergen schläft die Stadt; die Straße ist grün und schön. Grüße aus München!
Español: El niño pequeño comió una manzana en la mañana. ¿Dónde está la estación? ¡Olé!
Português: A criança não está aqui; ela está na praça com o irmão. Ação e coração.
Русский: Привет, как дела? Сегодня хорошая погода.
Ελληνικά: Καλημέρα κόσμε.
한국어: 안녕하세요. 오늘 날씨가 좋네요. 저는 학생입니다. 감사합니다! 서울은 큰 도시입니다.
中文：你好，世界。今天天气很好。我们一起去吃饭吧。
日本語：こんにちは、世界。今日はいい天気ですね。ありがとうございます。
Emoji: 😀 🎉 👍 🚀 ❤️ 🌍 🐍 ✨ — and symbols: € £ ¥ © ® ™ ° ± × ÷ → ← ≤ ≥ ∞ • …
"""


def build_tiny_tokenizer(
    out_dir: Path,
    *,
    num_vision_codes: int = 64,
    num_audio_codes: int = 64,
    bpe_vocab_size: int = BPE_VOCAB_SIZE,
    model_max_length: int = MODEL_MAX_LENGTH,
) -> int:
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja; return the size."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=bpe_vocab_size,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    # One "sentence" per line keeps training independent of thread scheduling.
    tokenizer.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    special = list(SPECIAL_TOKENS)
    special += [vision_code_token(i) for i in range(num_vision_codes)]
    special += [audio_code_token(i) for i in range(num_audio_codes)]
    special += REFERENCE_TOKENS
    tokenizer.add_special_tokens(special)

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"), pretty=True)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": ENDOFTEXT,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "model_max_length": model_max_length,
        "add_bos_token": False,
        "add_eos_token": False,
        # Cleanup would rewrite " ." to "." and break incremental detokenization exactness.
        "clean_up_tokenization_spaces": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return tokenizer.get_vocab_size(with_added_tokens=True)
