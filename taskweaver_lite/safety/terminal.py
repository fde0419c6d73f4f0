"""Terminal-safe text: what remains of model replies and cell output once every control sequence is gone.

Text from the model or from a cell must never drive the user's terminal: an OSC 52 sequence writes
the clipboard, OSC 0 sets the window title, `CSI 2J` clears the screen, `ESC c` resets the
terminal, DCS strings reach the terminal's parser. `strip_controls` is the one filter every such
text goes through before it is rendered, stored for prompts, or printed to a pipe; the styling the
program adds itself (rich's colours and spinner) is applied afterwards and is never filtered.
"""

from __future__ import annotations

import re

# A quick test first: most text has none of these and is returned as it is.
_SUSPECT = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")

_SEQUENCES = re.compile(
    # OSC, DCS, SOS, PM, APC strings (7- and 8-bit introducers) up to their terminator (BEL or ST).
    r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
    # CSI sequences (7- and 8-bit): colours, cursor moves, screen clears.
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]"
    # Any other escape: ESC with intermediates and a final byte (`ESC c`, `ESC ( B`), or a lone
    # introducer whose string never ended (its text then shows as text, harmless without the ESC).
    r"|\x1b[ -/]*[0-~]?"
)
# C0 controls but tab and newline, DEL, and C1 controls left over from broken sequences.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
# Lone surrogates cannot be encoded for the terminal, a file or the wire: they would lose the text.
_SURROGATES = re.compile(r"[\ud800-\udfff]")


def strip_controls(text: str) -> str:
    """`text` without terminal control sequences or control characters (tab and newline kept).

    Line endings become `\\n`; a carriage return that would overwrite a line is dropped; a lone
    surrogate becomes U+FFFD.
    """
    if not _SUSPECT.search(text):
        return text
    text = _SEQUENCES.sub("", text.replace("\r\n", "\n"))
    text = _CONTROLS.sub("", text)
    return _SURROGATES.sub("\ufffd", text)
