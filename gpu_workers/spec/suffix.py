"""Suffix decoding's trees (vLLM's method "suffix", after Arctic Inference's SuffixDecoding):
drafts from counted suffix trees, without a model. Our own implementation, pure Python.

What is counted. A SuffixTree holds some token sequences and counts, for every string of at
most `depth` tokens, how often it occurs in them (every start position counts, overlaps too).
Each request has its own tree over its prompt and output, extended as the request grows; one
global tree holds the outputs of the latest max_cached_requests requests that left (their
outputs only, not their prompts); a request that leaves moves its output there, and beyond
max_cached_requests the oldest is taken out again, counts and all.

How a draft is made, in each tree:
1. The match: the longest suffix of the sequence, at most `depth` tokens, that occurs in the
   tree. In the request's own tree the sequence itself is held, so there it is the longest
   suffix that also occurs earlier.
2. Room: a match of m tokens allows a draft of at most min(k, floor(max_spec_factor * m),
   depth - m) tokens (k: num_speculative_tokens and what max_model_len leaves), the last since
   the tree holds strings of at most `depth` tokens. Of the suffixes no longer than the match
   (each occurs where the match does), the draft starts from the longest one that allows the
   most tokens: with depth 24 and k = 15, a 20-token match is drafted from its last 12.
3. The walk: from that string, repeatedly take its most frequent next token (ties: the one
   counted first), multiplying the running probability by that token's share of the
   occurrences that have a next token in the tree. The draft stops before a token that would
   take the running probability below min_token_prob, when nothing follows, or at its room.
4. The score of a draft is the sum of its tokens' running probabilities (the tokens it may
   expect to keep). Both trees draft and the higher score wins; a tie goes to the request's own.

Representation, with memory in mind (an object and a dict per string would cost about 300
bytes, and a 40,000-token prompt holds up to 40,000 x depth strings). A string that occurs once
is not a node: its one occurrence is a tip, an int naming the sequence and start position, kept
in its parent's children, and everything below it is read off the sequence. Only strings that
occur at least twice are nodes (parallel lists: count, continued count, most frequent next
token, children; a node with one child holds it inline, without a dict), so a prompt costs
about what it repeats. A tip that gets a second occurrence becomes a node, its old occurrence
one level down as a tip. Appending a token updates the nodes of the sequence's suffixes that
occur at least twice, kept as handles, and adds a tip: O(depth) at most, usually a few dict
operations. The most frequent child is kept as counts grow, so a draft costs O(its length).

Measured (CPython 3.11 on the 2-core dev VM, depth 24, words of the docs as tokens): a request's
tree costs 140-180 bytes per token of natural text (7 MB for 40,000 tokens) and 1.7-2.9 us to
add a token; a 20,000-token passage given twice, the worst case, 840 bytes per token (34 MB for
the 40,000). The global tree costs 100-240 bytes per cached output token (1,000 outputs of 300
tokens: 31-72 MB), so vLLM's default of 10,000 cached requests may hold hundreds of MB in the
worker; taking an output out costs about 8 us a token. A draft on a 2,000-token sequence, one
new token counted, costs about 8 us with no global tree and 40 us with 1,000 cached outputs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["SuffixCache", "SuffixTree"]

ROOT = 0  # the node of the empty string; its count is the number of tokens held
_START_BITS = 32  # a tip packs (sequence key, start position) into one int


def _tip(key: int, start: int) -> int:
    """A string occurring once, at `start` in sequence `key`: negative, so apart from node ids."""
    return ~((key << _START_BITS) | start)


def _untip(tip: int) -> tuple[int, int]:
    code = ~tip
    return code >> _START_BITS, code & ((1 << _START_BITS) - 1)


class SuffixTree:
    """Occurrence counts of every string of at most `depth` tokens in the sequences it holds.

    A node is an int: >= 0 a node id (a string occurring at least twice), < 0 a tip. The
    handles of a growing sequence (its suffixes that are nodes, 1, 2, ... tokens long) are
    valid while nothing is removed; remove() is for finished sequences (the global tree)."""

    def __init__(self, depth: int) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self.depth = depth
        # by node id: occurrences, occurrences followed by a token in the tree (the sum of the
        # children's counts, a tip counting 1), the most frequent next token (None: no
        # children, or not known since a removal), the children: none, the only one (its
        # token is best; most nodes have one, and a dict costs ~200 bytes), or by token
        self.counts: list[int] = [0]
        self.continued: list[int] = [0]
        self.best: list[int | None] = [None]
        self.children: list[dict[int, int] | int | None] = [None]
        self.sequences: dict[int, list[int]] = {}
        self._handles: dict[int, list[int]] = {}
        self._free: list[int] = []

    @property
    def num_nodes(self) -> int:
        return len(self.counts) - len(self._free)

    def count(self, node: int) -> int:
        return self.counts[node] if node >= 0 else 1

    def handles(self, key: int) -> list[int]:
        """The nodes of sequence key's suffixes that occur at least twice: [i] is i + 1 tokens long."""
        return self._handles.get(key, [])

    def extend(self, key: int, tokens: Sequence[int]) -> None:
        """Appends tokens to sequence key (a new one if unknown), counting each new string."""
        seq = self.sequences.setdefault(key, [])
        handles = self._handles.get(key, [])
        depth = self.depth
        for t in tokens:
            seq.append(t)
            i = len(seq) - 1
            self.counts[ROOT] += 1
            new: list[int] = []
            parent = ROOT
            # the suffixes ending at i, shortest first: seq[i - n + 1 : i + 1] for n = 1, 2, ...
            for n in range(1, min(depth, i + 1) + 1):
                child = self._child(parent, t)
                if child is None:  # new: it (and each longer suffix, under its own parent) occurs only here
                    self._put(parent, t, _tip(key, i - n + 1))
                    self._counted(parent, t, 1)
                else:
                    if child < 0:
                        child = self._split(child, n)
                        self._put(parent, t, child)
                    else:
                        self.counts[child] += 1
                    self._counted(parent, t, self.counts[child])
                    new.append(child)
                if n > len(handles):  # the previous suffix of n tokens occurred once: it is a tip, which holds this one
                    break
                parent = handles[n - 1]
            handles = new
        self._handles[key] = handles

    def add(self, key: int, tokens: Sequence[int]) -> None:
        """A finished sequence: counted, and no handles kept."""
        self.extend(key, tokens)
        self._handles.pop(key, None)

    def remove(self, key: int) -> None:
        """Takes a finished sequence out: every string's count loses its occurrences there."""
        seq = self.sequences[key]
        self._handles.pop(key, None)
        self.counts[ROOT] -= len(seq)
        for start in range(len(seq)):
            node = ROOT
            for n in range(1, min(self.depth, len(seq) - start) + 1):
                t = seq[start + n - 1]
                child = self._child(node, t)
                assert child is not None
                self.continued[node] -= 1
                if self.best[node] == t and isinstance(self.children[node], dict):
                    self.best[node] = None  # another child may be as frequent now
                if child < 0:  # the occurrence at `start` was the only one
                    assert _untip(child) == (key, start)
                    self._take(node, t)
                    break
                self.counts[child] -= 1
                if self.counts[child] == 0:
                    self._take(node, t)
                    self._free_below(child)
                    break
                node = child
        del self.sequences[key]

    def find(self, pattern: Sequence[int]) -> int | None:
        """The node of `pattern`, or None when it does not occur (or is deeper than the tree)."""
        if len(pattern) > self.depth:
            return None
        node = ROOT
        for n, t in enumerate(pattern):
            if node < 0:
                key, start = _untip(node)
                seq = self.sequences[key]
                if start + n >= len(seq) or seq[start + n] != t:
                    return None
                continue
            child = self._child(node, t)
            if child is None:
                return None
            node = child
        return node

    def walk(self, node: int, length: int, most: int, min_prob: float) -> tuple[list[int], float]:
        """The draft from the node of a string of `length` tokens: most frequent next tokens,
        at most `most` of them, while the running probability stays >= min_prob; and its
        score, the sum of the running probabilities."""
        draft: list[int] = []
        prob, score = 1.0, 0.0
        most = min(most, self.depth - length)
        while len(draft) < most:
            if node < 0:  # one occurrence: what follows it, each token with probability 1
                key, start = _untip(node)
                pos = start + length + len(draft)
                rest = self.sequences[key][pos : pos + most - len(draft)]
                draft += rest
                score += prob * len(rest)
                break
            t = self._best(node)
            if t is None:
                break
            child = self._child(node, t)
            assert child is not None
            p = prob * self.count(child) / self.continued[node]
            if p < min_prob:
                break
            draft.append(t)
            prob = p
            score += p
            node = child
        return draft, score

    def _child(self, node: int, t: int) -> int | None:
        kids = self.children[node]
        if kids is None or isinstance(kids, int):
            return kids if kids is not None and self.best[node] == t else None
        return kids.get(t)

    def _put(self, node: int, t: int, child: int) -> None:
        kids = self.children[node]
        if kids is None or (isinstance(kids, int) and self.best[node] == t):
            self.children[node], self.best[node] = child, t
        elif isinstance(kids, int):
            best = self.best[node]
            assert best is not None
            self.children[node] = {best: kids, t: child}
        else:
            kids[t] = child

    def _take(self, node: int, t: int) -> None:
        kids = self.children[node]
        if isinstance(kids, dict):
            del kids[t]
        else:
            self.children[node], self.best[node] = None, None

    def _best(self, node: int) -> int | None:
        t = self.best[node]
        kids = self.children[node]
        if t is None and isinstance(kids, dict) and kids:  # not known since a removal: look
            t = self.best[node] = max(kids, key=lambda k: self.count(kids[k]))
        return t

    def _counted(self, parent: int, t: int, count: int) -> None:
        """One more occurrence of parent's string followed by t, which now occurs count times."""
        self.continued[parent] += 1
        best = self.best[parent]
        if best is None:
            if self.continued[parent] == 1:  # its first child; else not known: looked up when needed
                self.best[parent] = t
        elif best != t:
            other = self._child(parent, best)
            assert other is not None
            if count > self.count(other):
                self.best[parent] = t

    def _split(self, tip: int, n: int) -> int:
        """The n-token string at `tip` occurs a second time: a node counting 2, with the old
        occurrence's next token (when it has one within depth) leading to the old tip."""
        key, start = _untip(tip)
        seq = self.sequences[key]
        node = self._new_node(2)
        if n < self.depth and start + n < len(seq):
            self.children[node], self.best[node] = tip, seq[start + n]
            self.continued[node] = 1
        return node

    def _new_node(self, count: int) -> int:
        if self._free:
            node = self._free.pop()
            self.counts[node], self.continued[node], self.best[node], self.children[node] = count, 0, None, None
            return node
        self.counts.append(count)
        self.continued.append(0)
        self.best.append(None)
        self.children.append(None)
        return len(self.counts) - 1

    def _free_below(self, node: int) -> None:
        """Frees a node whose count fell to 0, and the nodes under it (all at 0 too)."""
        stack = [node]
        while stack:
            n = stack.pop()
            kids = self.children[n]
            stack.extend(c for c in (kids.values() if isinstance(kids, dict) else [kids]) if c is not None and c >= 0)
            self.counts[n], self.continued[n], self.best[n], self.children[n] = 0, 0, None, None
            self._free.append(n)


@dataclass(slots=True)
class _Request:
    tree: SuffixTree  # over its prompt and output: sequence 0
    num_prompt_tokens: int

    @property
    def tokens(self) -> list[int]:
        return self.tree.sequences.setdefault(0, [])


class SuffixCache:
    """Suffix decoding's trees for one worker: one per request it drafts for, and the global
    tree of the outputs of the latest max_cached_requests requests (0: none). The drafting
    rules are the module docstring's."""

    def __init__(self, depth: int, max_cached_requests: int, max_spec_factor: float, min_token_prob: float) -> None:
        self.depth = depth
        self.max_cached_requests = max_cached_requests
        self.max_spec_factor = max_spec_factor
        self.min_token_prob = min_token_prob
        self.requests: dict[str, _Request] = {}
        self.global_tree = SuffixTree(depth)
        self._cached: deque[int] = deque()  # the global tree's sequence keys, oldest first
        self._next_key = 0

    def draft(self, request_id: str, tokens: Sequence[int], num_prompt_tokens: int, k: int) -> list[int]:
        """Up to k tokens to follow `tokens`, the request's prompt and output so far."""
        own = self._indexed(request_id, tokens, num_prompt_tokens).tree
        if k < 1:
            return []
        best: tuple[list[int], float] = ([], 0.0)
        handles = own.handles(0)
        m = self._start(len(handles), k)
        if m:
            best = own.walk(handles[m - 1], m, self._room(m, k), self.min_token_prob)
        if self._cached:
            m = self._start(self._global_match(tokens), k)
            node = self.global_tree.find(tokens[len(tokens) - m :]) if m else None
            if node is not None:
                theirs = self.global_tree.walk(node, m, self._room(m, k), self.min_token_prob)
                if theirs[1] > best[1]:
                    best = theirs
        return best[0]

    def release(self, request_id: str) -> None:
        """The request left: its tree goes, its output joins the global tree (the oldest
        cached output leaving it beyond max_cached_requests)."""
        request = self.requests.pop(request_id, None)
        if request is None or self.max_cached_requests == 0:
            return
        output = request.tokens[request.num_prompt_tokens :]
        if not output:
            return
        self.global_tree.add(self._next_key, output)
        self._cached.append(self._next_key)
        self._next_key += 1
        while len(self._cached) > self.max_cached_requests:
            self.global_tree.remove(self._cached.popleft())

    def _indexed(self, request_id: str, tokens: Sequence[int], num_prompt_tokens: int) -> _Request:
        """The request's tree with every token counted. Only the tokens it has not seen are
        added; a sequence that got shorter, or whose last seen token changed, is counted
        afresh (the runner only appends, but this is cheap to check)."""
        request = self.requests.get(request_id)
        seen = len(request.tokens) if request is not None else 0
        if request is None or len(tokens) < seen or (seen and tokens[seen - 1] != request.tokens[seen - 1]):
            request = self.requests[request_id] = _Request(SuffixTree(self.depth), num_prompt_tokens)
            seen = 0
        request.tree.extend(0, tokens[seen:])
        return request

    def _global_match(self, tokens: Sequence[int]) -> int:
        """The longest suffix of tokens (at most depth) in the global tree: a binary search,
        since every suffix of a string that occurs occurs too."""
        low, high = 0, min(self.depth, len(tokens))
        while low < high:
            mid = (low + high + 1) // 2
            if self.global_tree.find(tokens[len(tokens) - mid :]) is None:
                high = mid - 1
            else:
                low = mid
        return low

    def _room(self, m: int, k: int) -> int:
        return min(k, int(self.max_spec_factor * m), self.depth - m)

    def _start(self, match: int, k: int) -> int:
        """How many of the match's last tokens to draft from: the longest that allows the
        most draft tokens (0: none allows any)."""
        start = room = 0
        for m in range(match, 0, -1):
            if self._room(m, k) > room:
                start, room = m, self._room(m, k)
        return start
