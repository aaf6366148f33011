"""``harmony``: gpt-oss output, parsed by the official ``openai-harmony`` package.

gpt-oss writes messages, each ``<|start|>assistant<|channel|>CHANNEL[ to=RECIPIENT]
[<|constrain|>TYPE]<|message|>TEXT`` ended by ``<|end|>``, ``<|call|>`` (a tool call) or
``<|return|>`` (the answer); the first message's ``<|start|>assistant`` is in the prompt.
The pieces are turned into harmony token ids (markup tokens as harmony's special ids,
ordinary text as ordinary tokens, so text that spells ``<|end|>`` stays text) and fed to
harmony's ``StreamableParser`` one id at a time, as vLLM does. Mapping:

- channel ``analysis``: reasoning (several messages joined by newlines);
- recipient ``functions.NAME`` (in the header or after the channel): a tool call of NAME,
  its text a JSON object;
- channel ``final``, or ``commentary`` without recipient (a preamble): content.
Parse failures (each counted once, its text kept in the content): a sequence harmony rejects
(the rest of the output from the broken message on), a message from a role other than the
assistant, a call to a recipient outside ``functions.`` (built-in browser/python tools the
client never offered), call arguments that are not a JSON object, a call cut off before
``<|call|>``, a harmony special token inside a message's text. A truncated analysis or final
message is kept as it is.

The encoding needs the ``o200k_base`` vocabulary: harmony downloads it, or reads it from the
directory ``TIKTOKEN_ENCODINGS_BASE`` names (offline machines; ``infra/setup.sh`` writes one to
``.cache/tiktoken``). Without it the parser cannot be made: ``HarmonyUnavailable`` at session
creation, not mid-trial. The entry points (``trialflow proxy``, the worker) name that directory
themselves (``use_vocabulary``, from the setting ``harmony_vocab_dir``), so no caller has to
export the variable.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from typing import Any, ClassVar

from proxy.chat import ToolSpec
from proxy.parsers._pieces import Markup, Piece
from proxy.parsers._tools import Call, ExtractedCalls, loads

MESSAGE_ENDS = ("<|end|>", "<|call|>", "<|return|>")
FUNCTIONS = "functions."
_SLICE = 256


# The variable openai-harmony reads for a local directory of tiktoken vocabularies.
VOCABULARY_ENV = "TIKTOKEN_ENCODINGS_BASE"


class HarmonyUnavailable(RuntimeError):
    """The harmony encoding cannot be loaded (package or vocabulary missing)."""


def use_vocabulary(directory: str | os.PathLike[str]) -> None:
    """Make harmony read ``o200k_base.tiktoken`` from ``directory`` (sets ``VOCABULARY_ENV``
    for this process; harmony reads it when it loads the encoding). Takes effect for an
    encoding not loaded yet: call it before the first harmony parser is made (the proxy makes
    its parsers at start-up). A directory without the file is not checked here: making the
    parser then fails with ``HarmonyUnavailable``, naming the variable."""
    os.environ[VOCABULARY_ENV] = os.fspath(directory)


@functools.lru_cache(maxsize=1)
def _encoding() -> Any:
    try:
        import openai_harmony as oh
    except ImportError as e:  # pragma: no cover - a dependency of the distribution
        raise HarmonyUnavailable("the harmony parser needs the openai-harmony package") from e
    try:
        return oh.load_harmony_encoding(oh.HarmonyEncodingName.HARMONY_GPT_OSS)
    except oh.HarmonyError as e:
        raise HarmonyUnavailable(
            f"cannot load the gpt-oss harmony encoding ({e}); on a machine without internet access "
            "set TIKTOKEN_ENCODINGS_BASE to a directory holding o200k_base.tiktoken "
            "(python -m infra.tiktoken_vocab writes one)"
        ) from e


@functools.lru_cache(maxsize=1)
def _special_tokens() -> frozenset[str]:
    return frozenset(_encoding().special_tokens_set)


@functools.lru_cache(maxsize=256)
def _special_id(text: str) -> int:
    # allowed_special="all" (not {text}): harmony compiles a regex of every other special
    # token for each call that disallows some (~1 ms each)
    (token,) = _encoding().encode(text, allowed_special="all")
    return int(token)


class HarmonyToolParser:
    markup: ClassVar[frozenset[str]] = frozenset(
        {"<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", *MESSAGE_ENDS}
    )

    def __init__(self) -> None:
        self._enc = _encoding()
        self._special = _special_tokens()
        self._ends = frozenset(_special_id(t) for t in MESSAGE_ENDS)
        self._message = _special_id("<|message|>")

    def _ids(self, pieces: Sequence[Piece]) -> list[int]:
        ids: list[int] = []
        for p in pieces:
            if isinstance(p, Markup) and p.text in self._special:
                ids.append(_special_id(p.text))
                continue
            text = p if isinstance(p, str) else p.text
            # BPE is quadratic in the length of one pre-token (a run of 30K "=" is one), so
            # text is encoded in bounded slices; the ids differ from one encode, the text not.
            for k in range(0, len(text), _SLICE):
                ids.extend(self._enc.encode(text[k : k + _SLICE], disallowed_special=()))
        return ids

    def extract(self, pieces: Sequence[Piece], tool_specs: list[ToolSpec] | None = None) -> ExtractedCalls:
        import openai_harmony as oh

        enc = self._enc
        ids = self._ids(pieces)
        parser = oh.StreamableParser(enc, role=oh.Role.ASSISTANT)
        out = ExtractedCalls(content="")
        leftover = ""
        msg_start = 0  # index in ids where the message being parsed began
        in_text = False  # tracked here: the parser's own state is costly to read per token
        try:
            for k, t in enumerate(ids):
                if t == self._message:
                    in_text = True
                elif t in self._ends:
                    in_text = False
                    msg_start = k + 1
                elif in_text and enc.is_special_token(t):
                    out.failures += 1  # markup inside a message's text
                parser.process(t)
            cut_call = parser.state == oh.StreamState.CONTENT and parser.current_recipient is not None
            if parser.state != oh.StreamState.EXPECT_START:
                parser.process_eos()  # a truncated message: keep what it has
        except oh.HarmonyError:
            out.failures += 1
            leftover = enc.decode(ids[msg_start:])
            cut_call = False
        messages = list(parser.messages)
        reasoning: list[str] = []
        content: list[str] = []
        for index, m in enumerate(messages):
            text = "".join(getattr(c, "text", "") for c in m.content)
            if m.author.role != oh.Role.ASSISTANT:
                out.failures += 1
                content.append(text)
            elif m.recipient:
                call = _call(m.recipient, text)
                if call is None or (cut_call and index == len(messages) - 1):
                    out.failures += 1
                    content.append(text)
                else:
                    out.calls.append(call)
            elif m.channel == "analysis":
                reasoning.append(text)
            else:
                content.append(text)
        if leftover:
            content.append(leftover)
        out.content = "\n".join(c for c in content if c)
        out.reasoning = "\n".join(r for r in reasoning if r).strip() or None
        return out


class HarmonyReasoningParser:
    """The reasoning stage for gpt-oss: a pass-through, because harmony's analysis channel is
    read by ``HarmonyToolParser`` together with the other channels (one harmony parse per
    turn). ``check_parsers`` refuses it without the harmony tool parser."""

    markup: ClassVar[frozenset[str]] = HarmonyToolParser.markup

    def starts_inside(self, prompt_tail: Sequence[Piece]) -> bool:
        return False

    def split(
        self, pieces: Sequence[Piece], *, started_inside: bool = False
    ) -> tuple[str | None, list[Piece]]:
        return None, list(pieces)


def _call(recipient: str, text: str) -> Call | None:
    if not recipient.startswith(FUNCTIONS) or not recipient[len(FUNCTIONS) :].strip():
        return None
    try:
        args = loads(text) if text.strip() else {}
    except ValueError:
        return None
    return (recipient[len(FUNCTIONS) :].strip(), args) if isinstance(args, dict) else None
