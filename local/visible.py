"""Text from the host or the data, made safe to print: no byte of it can drive the terminal.

A log line, an error, a skip reason or a row's keys may hold escape sequences
(`ESC[2J` clears the screen, an OSC sets the window title or makes a hyperlink),
and hub datasets are untrusted input. Every value aerie shows passes through
`visible` first: C0 controls become their Unicode control pictures (`ESC` ->
`␛`, a tab -> `␉`, a line feed -> `␊`), DEL becomes `␡`, and C1 controls
(`\\x9b` is a CSI on some terminals) and lone surrogates (which no terminal
encoding can write) become `\\x9b`-style escapes. aerie's own styling is not
text: rich's `Text` styles are applied around the value, never parsed from it.

`inv logs` shows logs the same way, keeping line breaks and tabs, unless
`--raw` asks for the bytes as they are (`less -R` and `journalctl --all`
make the same choice the other way round).
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any, BinaryIO

_PICTURES = {code: chr(0x2400 + code) for code in range(0x20)} | {0x7F: "\u2421"}
_ESCAPES = {code: f"\\x{code:02x}" for code in range(0x80, 0xA0)} | {
    code: f"\\u{code:04x}" for code in range(0xD800, 0xE000)}
ONE_LINE = str.maketrans(_PICTURES | _ESCAPES)
LINES = str.maketrans({code: shown for code, shown in (_PICTURES | _ESCAPES).items() if chr(code) not in "\n\t"})


def visible(text: str, lines: bool = False) -> str:
    """`text` with every control character shown, not obeyed; `lines`: line feeds and tabs kept."""
    return text.translate(LINES if lines else ONE_LINE)


#: A control character in JSON written with `ensure_ascii=False`: escaped below 0x20, as is above.
_IN_JSON = re.compile(r"\\u00[01]|\\[bfnrt]|[\x7f-\x9f\ud800-\udfff]")


def visible_all(value: Any) -> Any:
    """`value` (a decoded JSON payload) with every string in it, keys too, made `visible`."""
    # NOTE: most payloads hold no control character at all: one search of their JSON (in C) says so
    # in a tenth of the time a walk takes (a status of 1,000 jobs: 27,000 strings).
    if not _IN_JSON.search(json.dumps(value, ensure_ascii=False, default=str)):
        return value
    return _walk(value)


def _walk(value: Any) -> Any:
    if isinstance(value, str):
        return value.translate(ONE_LINE)
    if isinstance(value, dict):
        return {_walk(k): _walk(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_walk(v) for v in value]
    return value


class VisibleStream:
    """A binary stream that writes what it is given as UTF-8, its control characters shown (`inv logs`)."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span two chunks

    def write(self, chunk: bytes) -> int:
        self.out.write(visible(self.decoder.decode(chunk), lines=True).encode())
        return len(chunk)

    def flush(self) -> None:
        self.out.flush()

    def close(self) -> None:
        """Write what is left of a character cut short at the end."""
        self.out.write(visible(self.decoder.decode(b"", final=True), lines=True).encode())
        self.out.flush()
