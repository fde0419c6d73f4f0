"""A reply read while it streams: the fields worth showing, taken from JSON that is not finished yet.

The screen shows the Planner's message and plan step and the CodeGenerator's code as they are
generated. `PartialReply` takes the reply's pieces in order and keeps, for the named fields, the
text of their string values decoded so far (escapes included), wherever they sit in the JSON.
A `<think>` block at the start is reasoning, kept apart. Nothing here decides what the reply says:
the finished reply is parsed by `replies.parse_reply` like any other, so a reading slip here can
only make the live view lag, never change the answer.
"""

from __future__ import annotations

import re
from collections.abc import Collection

_OPEN_TAGS = ("<think>", "<thinking>")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f", "/": "/", "\\": "\\", '"': '"'}

# The fields of the JSON roles' replies meant for the user while they stream (the terminal's and the
# page's live views): a plan step and a message, or code. A reply holds the ones its schema has.
SHOWN_FIELDS = ("current_plan_step", "message", "reply_content")


class PartialReply:
    """The named string fields of a streaming JSON reply, and its leading `<think>` text, so far."""

    def __init__(self, fields: Collection[str]) -> None:
        self.fields = frozenset(fields)
        self.values: dict[str, str] = {}
        self.reasoning = ""
        self._raw = ""
        self._fed = 0  # characters of the reply part already given to the scanner
        self._scanner = _Scanner(self)

    def feed(self, text: str) -> None:
        """Take the next piece of the reply's content."""
        self._raw += text
        reply = self._reply_part()
        if reply is not None and len(reply) > self._fed:
            self._scanner.feed(reply[self._fed :])
            self._fed = len(reply)

    def _reply_part(self) -> str | None:
        """The content after a leading think block; None while that block (or its tag) is still open."""
        body = self._raw.lstrip()
        lowered = body.lower()
        for tag in _OPEN_TAGS:
            if tag.startswith(lowered):
                return None  # a tag still arriving
            if lowered.startswith(tag):
                close = lowered.find(f"</{tag[1:]}")
                if close < 0:
                    self.reasoning = body[len(tag) :]
                    return None
                self.reasoning = body[len(tag) : close]
                return body[close + len(tag) + 1 :]
        return self._raw

    def _append(self, key: str, text: str) -> None:
        self.values[key] = self.values.get(key, "") + text


_STRING_SPECIAL = re.compile(r'["\\]')  # what ends a run of ordinary characters inside a JSON string


class _Scanner:
    """A JSON tokenizer fed piece by piece: tracks keys and streams the wanted string values out."""

    def __init__(self, reply: PartialReply) -> None:
        self._reply = reply
        self._stack: list[str] = []  # "{" or "[" per open container
        self._expect_key = False
        self._in_string = False
        self._is_key = False
        self._key = ""
        self._last_key: str | None = None
        self._target: str | None = None  # the field whose value is being read
        self._escape: str | None = None  # an escape sequence being read, from its backslash
        self._high = ""  # the first half of a \uXXXX surrogate pair, waiting for its second

    def feed(self, text: str) -> None:
        """Scan the next characters (a string's ordinary characters a run at a time)."""
        out: list[str] = []
        at, end = 0, len(text)
        while at < end:
            if self._in_string and self._escape is None:
                special = _STRING_SPECIAL.search(text, at)
                stop = special.start() if special else end
                if stop > at:
                    self._emit(text[at:stop], out)
                    at = stop
                    continue
            if self._in_string:
                self._string_char(text[at], out)
            else:
                self._structure_char(text[at])
            at += 1
        self._flush(out)

    def _structure_char(self, char: str) -> None:
        if char == '"':
            self._in_string = True
            self._is_key = bool(self._stack) and self._stack[-1] == "{" and self._expect_key
            self._key = ""
            in_object = bool(self._stack) and self._stack[-1] == "{"
            wanted = not self._is_key and in_object and self._last_key in self._reply.fields
            self._target = self._last_key if wanted else None
        elif char in "{[":
            self._stack.append(char)
            self._expect_key = char == "{"
        elif char in "}]":
            if self._stack:
                self._stack.pop()
            self._expect_key = False
        elif char == ",":
            self._expect_key = bool(self._stack) and self._stack[-1] == "{"
        elif char == ":":
            self._expect_key = False

    def _string_char(self, char: str, out: list[str]) -> None:
        if self._escape is not None:
            self._escape += char
            decoded = _decode_escape(self._escape)
            if decoded is not None:
                self._escape = None
                self._emit(self._pair(decoded), out)
            return
        if char == "\\":
            self._escape = ""
        elif char == '"':
            self._in_string = False
            if self._is_key:
                self._last_key = self._key
            self._flush(out)
            self._target = None
        else:
            self._emit(char, out)

    def _pair(self, char: str) -> str:
        """`char`, joined with a waiting high surrogate; a lone half becomes U+FFFD (it cannot be printed)."""
        high, self._high = self._high, ""
        if len(char) == 1 and 0xD800 <= ord(char) <= 0xDBFF:
            self._high = char
            return "\ufffd" if high else ""
        if len(char) == 1 and 0xDC00 <= ord(char) <= 0xDFFF:
            return (high + char).encode("utf-16", "surrogatepass").decode("utf-16") if high else "\ufffd"
        return ("\ufffd" if high else "") + char

    def _emit(self, text: str, out: list[str]) -> None:
        if self._is_key:
            self._key += text
        elif self._target is not None:
            out.append(text)

    def _flush(self, out: list[str]) -> None:
        if out and self._target is not None:
            self._reply._append(self._target, "".join(out))
        out.clear()


def _decode_escape(sequence: str) -> str | None:
    """The text of a JSON escape (without its backslash), or None while it is incomplete."""
    if sequence[0] != "u":
        return _ESCAPES.get(sequence[0], sequence[0])
    if len(sequence) < 5:
        return None
    try:
        return chr(int(sequence[1:5], 16))
    except ValueError:
        return sequence
