"""Chat workloads for speculative decoding (bench/spec_decode.py, tests/e2e/test_speculative.py).

Three kinds, each a list of chat message lists, written for this project:
- copy: repeat or lightly edit a given passage (the answer is mostly the prompt's text);
- open: stories and explanations (little of the answer is in the prompt);
- multi-turn: a chat whose last turn asks to quote or restate what earlier turns said.
"""

from __future__ import annotations

from typing import Any

Messages = list[dict[str, Any]]

PASSAGES = [
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He wound the clockwork, "
    "trimmed the wick, polished the great lens until it gleamed, and then sat by the window with a cup "
    "of tea, watching the ships pass far out on the grey water.",
    "To make the bread, mix four cups of flour with a spoon of salt and a packet of yeast. Add warm "
    "water slowly until the dough comes together, knead it for ten minutes, and leave it covered in a "
    "warm place for an hour, until it has doubled in size.",
    "The committee met on Tuesday to discuss the new library. Members agreed that the reading room "
    "should face the park, that the children's section needs its own entrance, and that the opening "
    "should be planned for the first week of spring.",
    "Mountain goats can climb almost vertical cliffs. Their hooves have a hard outer edge and a soft "
    "inner pad that grips the rock, and their strong shoulders let them pull themselves up ledges that "
    "would stop any other animal of their size.",
    "Our office will be closed on Monday for the holiday. Orders placed over the weekend will ship on "
    "Tuesday morning, and the support team will answer all messages in the order they were received as "
    "soon as we are back.",
    "The river begins as a small stream high in the hills. It gathers water from a dozen brooks as it "
    "runs south, turns the wheel of the old mill at the edge of the village, and finally spreads out "
    "into the wide marshes by the sea.",
    "Please remember to bring your own water bottle, a hat, comfortable shoes and a light jacket. The "
    "walk takes about three hours, there is no shop along the way, and the weather on the ridge can "
    "change very quickly in the afternoon.",
]

_COPY_ASKS = [
    "Repeat the following passage exactly, word for word:\n\n{p}",
    "Copy this text back to me without changing anything:\n\n{p}",
]
_EDIT_ASKS = [
    "Rewrite the following passage, changing only the first sentence to the past tense where needed "
    "and keeping everything else the same:\n\n{p}",
]

_OPEN = [
    "Tell me a short story about a robot who learns to paint.",
    "Write a story about a cat who lives in a bookshop.",
    "Explain how a rainbow forms, for a ten-year-old.",
    "Tell me a story about two friends lost in a forest at night.",
    "Describe a busy market in a small town on a Saturday morning.",
    "Write a short fable about a tortoise and a crow.",
    "Explain why the sky is blue.",
    "Tell me a story about a girl who finds a map in her attic.",
    "Write a story about a dragon who is afraid of the dark.",
    "Describe what a day on a fishing boat is like.",
    "Tell me about the life of a honeybee in summer.",
    "Write a story about a train that runs between two villages.",
    "Explain how a bicycle stays upright.",
    "Tell me a story about an old clockmaker and his apprentice.",
]


def copy_prompts() -> list[Messages]:
    asks = [a.format(p=p) for p in PASSAGES for a in (*_COPY_ASKS, *_EDIT_ASKS)]
    return [[{"role": "user", "content": a}] for a in asks]


def open_prompts() -> list[Messages]:
    return [[{"role": "user", "content": q}] for q in _OPEN]


def multi_turn_prompts() -> list[Messages]:
    """Two turns about a passage, then a question whose answer quotes the earlier turns."""
    chats = []
    for i, p in enumerate(PASSAGES):
        first = p.split(". ")[0] + "."
        for last in ("Now say again, word for word, the text I gave you first.",
                     "Quote your previous answer exactly, then add one sentence of your own."):  # fmt: skip
            chats.append([
                {"role": "user", "content": f"Here is a text I am working on:\n\n{p}"},
                {"role": "assistant", "content": f"Thank you. The text begins: {first} Shall I help with it?"},
                {"role": "user", "content": "Yes. What is its first sentence?" if i % 2 else "Yes. Summarise it in one line."},
                {"role": "assistant", "content": first},
                {"role": "user", "content": last},
            ])  # fmt: skip
    return chats


WORKLOADS = {"copy": copy_prompts, "open": open_prompts, "multi-turn": multi_turn_prompts}
