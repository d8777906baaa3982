"""Seeded workloads: what to send, decided before anything is sent.

A workload is a list of Conversations. A conversation is one or more user turns; turn t
is sent with the whole history before it, including the server's replies to turns
0..t-1, so a conversation's turns go out one after another. The random and shared-prefix
workloads are conversations of one turn.

Lengths are counted in words drawn from _WORDS, short common English words that the
usual BPE tokenizers (Llama, Qwen, GPT) encode as one token each with their leading
space, so a length of N words is roughly N prompt tokens plus the chat template. No
tokenizer is needed; the real counts come back in usage.prompt_tokens and are reported.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal

_WORDS = (
    "the of and to in is was for on are with as by at from his that this be it an have not "
    "they which or had one were all we when there can been has more if will would who so no "
    "river mountain engine signal garden window market paper silver winter summer harbor "
    "orbit kernel matrix vector token stream server client batch cache memory thread socket "
    "planet forest valley island bridge tunnel castle tower village city number letter "
    "question answer story song music color light shadow water fire earth stone metal glass "
    "wood cloud storm rain snow quick slow bright dark warm cold green blue red yellow orange "
    "small large old new simple happy calm brave quiet loud"
).split()


@dataclass(frozen=True, slots=True)
class LengthRange:
    """An inclusive range of lengths; a single value when low == high."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if not 0 < self.low <= self.high:
            raise ValueError(f"length range needs 0 < low <= high, got {self.low}:{self.high}")

    @classmethod
    def parse(cls, text: str) -> LengthRange:
        """'128' or '64:256'."""
        low, _, high = text.partition(":")
        return cls(int(low), int(high or low))

    def sample(self, rng: random.Random) -> int:
        return rng.randint(self.low, self.high)

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}:{self.high}"


@dataclass(frozen=True, slots=True)
class Conversation:
    conversation_id: int
    user_turns: tuple[str, ...]
    max_tokens: tuple[int, ...]  # one per turn
    system_prompt: str | None = None
    group: int | None = None  # shared-prefix group

    @property
    def num_turns(self) -> int:
        return len(self.user_turns)

    def messages(self, replies: list[str]) -> list[dict[str, str]]:
        """Chat messages for turn len(replies): the history with every earlier reply."""
        turn = len(replies)
        out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        for user, reply in zip(self.user_turns[:turn], replies, strict=True):
            out += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
        out.append({"role": "user", "content": self.user_turns[turn]})
        return out

    def prompt(self, replies: list[str]) -> str:
        """The same history as plain text, for the completions endpoint."""
        parts = [self.system_prompt] if self.system_prompt else []
        for message in self.messages(replies)[len(parts):]:
            parts.append(f"{message['role'].capitalize()}: {message['content']}")
        return "\n\n".join(parts) + "\n\nAssistant:"


def random_words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choices(_WORDS, k=n))


class Workload(ABC):
    """A workload variant; its dataclass fields are its whole configuration."""

    name: ClassVar[str]

    @abstractmethod
    def conversations(self, seed: int) -> list[Conversation]: ...


@dataclass(frozen=True)
class RandomWorkload(Workload):
    name: ClassVar[str] = "random"
    num_requests: int
    input_len: LengthRange
    max_tokens: LengthRange

    def conversations(self, seed: int) -> list[Conversation]:
        rng = random.Random(seed)
        out = []
        for i in range(self.num_requests):
            text = random_words(rng, self.input_len.sample(rng))
            out.append(Conversation(i, (text,), (self.max_tokens.sample(rng),)))
        return out


Order = Literal["random", "grouped", "interleaved"]


@dataclass(frozen=True)
class SharedPrefixWorkload(Workload):
    """num_groups long system prompts, each followed by its own short questions."""

    name: ClassVar[str] = "shared-prefix"
    num_groups: int
    questions_per_group: int
    prefix_len: int
    question_len: LengthRange
    max_tokens: LengthRange
    order: Order = "random"

    def conversations(self, seed: int) -> list[Conversation]:
        rng = random.Random(seed)
        prefixes = [random_words(rng, self.prefix_len) for _ in range(self.num_groups)]
        # questions[g][q]; the "Question q" header keeps a group's questions distinct.
        questions = [
            [
                (f"Question {q}: {random_words(rng, self.question_len.sample(rng))}?",
                 self.max_tokens.sample(rng))
                for q in range(self.questions_per_group)
            ]
            for _ in range(self.num_groups)
        ]
        pairs = [(g, q) for g in range(self.num_groups) for q in range(self.questions_per_group)]
        if self.order == "interleaved":
            pairs.sort(key=lambda gq: (gq[1], gq[0]))
        elif self.order == "random":
            rng.shuffle(pairs)
        out = []
        for i, (g, q) in enumerate(pairs):
            text, max_tokens = questions[g][q]
            out.append(Conversation(i, (text,), (max_tokens,), system_prompt=prefixes[g], group=g))
        return out


@dataclass(frozen=True)
class MultiTurnWorkload(Workload):
    name: ClassVar[str] = "multi-turn"
    num_conversations: int
    num_turns: int
    input_len: LengthRange
    max_tokens: LengthRange

    def conversations(self, seed: int) -> list[Conversation]:
        rng = random.Random(seed)
        out = []
        for c in range(self.num_conversations):
            turns = tuple(random_words(rng, self.input_len.sample(rng)) for _ in range(self.num_turns))
            max_tokens = tuple(self.max_tokens.sample(rng) for _ in range(self.num_turns))
            out.append(Conversation(c, turns, max_tokens))
        return out


WORKLOADS: dict[str, type[Workload]] = {
    cls.name: cls for cls in (RandomWorkload, SharedPrefixWorkload, MultiTurnWorkload)
}
