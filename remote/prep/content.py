"""A turn's content, a string or a list of parts, to its text, reasoning and tool calls; and the
images (or other media) that keep a row out, however they arrive.

Parts carry their text under whichever key their converter chose: OpenAI's ``{"type": "text",
"text": …}``, LLaMA-Factory's newer ``{"type": "text" | "reasoning" | "tool_call", "value": …}``
(a call's value is the JSON text of ``{"name", "arguments"}``), or ``content``. A part of a type
aerie does not know is a skip reason that names its type and keys, never text guessed at.

NOTE: the draft is text-only. A row with an image (a content part, an ``image``/``images``
field, LLaVA's ``<image>`` placeholder in a user turn) is skipped: kept as text, the draft
would learn answers about pictures it never saw.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from remote.prep.errors import Skip

TEXT_TYPES = ("text", "input_text", "output_text")
REASONING_TYPES = ("reasoning", "thinking")
CALL_TYPES = ("tool_call", "tool_calls", "function_call")
#: Part types that hold media, and the medium each names in the skip reason.
MEDIA_TYPES = {"image": "image", "image_url": "image", "input_image": "image", "video": "video",
               "video_url": "video", "input_video": "video", "audio": "audio", "audio_url": "audio",
               "input_audio": "audio"}
#: Row fields that hold media (LLaVA's `image`; LLaMA-Factory's `images`, `videos`, `audios`).
MEDIA_FIELDS = {"image": "image", "images": "image", "video": "video", "videos": "video", "audio": "audio",
                "audios": "audio"}
#: Placeholders a user turn carries where the media go (LLaVA, LLaMA-Factory).
MEDIA_PLACEHOLDERS = {"<image>": "image", "<video>": "video", "<audio>": "audio"}
#: Where a part keeps its text, in order of preference.
TEXT_KEYS = ("text", "value", "content")
REASONING_KEYS = TEXT_KEYS + ("reasoning", "thinking")


@dataclass
class Content:
    """What a turn's content holds."""

    text: str = ""
    reasoning: str = ""
    #: Tool calls as the parts held them (dicts), for `remote.prep.tools.tool_calls`.
    calls: list[Any] = field(default_factory=list)


def read_content(value: Any) -> Content:
    """The text, reasoning and calls of a turn's content; raises `Skip`."""
    if value is None:
        return Content()
    if isinstance(value, str):
        return Content(value)
    if not isinstance(value, list):
        raise Skip(f"content is {type(value).__name__}, not text")
    texts, reasoning, calls = [], [], []
    for part in value:
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            raise Skip(f"content part is {type(part).__name__}, not text")
        kind = part.get("type") or "text"
        if kind in MEDIA_TYPES:
            raise Skip(media_reason(MEDIA_TYPES[kind], f"content part {kind!r}"))
        if kind in TEXT_TYPES:
            texts.append(_text(part, kind, TEXT_KEYS))
        elif kind == "refusal":  # OpenAI's: the assistant's words, under their own key
            texts.append(_text(part, kind, ("refusal",) + TEXT_KEYS))
        elif kind in REASONING_TYPES:
            reasoning.append(_text(part, kind, REASONING_KEYS))
        elif kind in CALL_TYPES:
            calls.extend(_calls(part, kind))
        else:
            raise Skip(f"content part of type {kind!r} not understood (keys: {_keys(part)})")
    return Content("".join(texts), "".join(reasoning), calls)


def media_reason(medium: str, where: str) -> str:
    return f"{medium} in the row ({where})"


def row_media(row: dict[str, Any]) -> str | None:
    """Why `row` holds media in a field of its own, or None."""
    for key, medium in MEDIA_FIELDS.items():
        if row.get(key) not in (None, "", [], {}):
            return media_reason(medium, f"field {key!r}")
    return None


def placeholder_media(turns: list[dict[str, Any]]) -> str | None:
    """Why a user turn of `turns` holds a media placeholder (its picture is elsewhere), or None."""
    for turn in turns:
        if turn["role"] != "user":
            continue
        for placeholder, medium in MEDIA_PLACEHOLDERS.items():
            if placeholder in turn["content"]:
                return media_reason(medium, f"{placeholder} in a user turn")
    return None


def _text(part: dict[str, Any], kind: str, keys: tuple[str, ...]) -> str:
    for key in keys:
        if isinstance(part.get(key), str):
            return part[key]
    raise Skip(f"content part of type {kind!r} has no text under {', '.join(keys)} (keys: {_keys(part)})")


def _calls(part: dict[str, Any], kind: str) -> list[Any]:
    """The calls a call part holds: JSON text or an object (or a list) under value/text/content/
    function, else the part's own ``name``/``arguments``."""
    payload = next((part[k] for k in ("value", "text", "content", "function") if part.get(k) is not None), None)
    if payload is None:
        payload = {k: v for k, v in part.items() if k != "type"}
    if isinstance(payload, str):
        try:
            payload = json.loads(payload)
        except json.JSONDecodeError:
            raise Skip(f"content part of type {kind!r} is not JSON (keys: {_keys(part)})") from None
    if isinstance(payload, dict) and "name" in payload and part.get("id") is not None:
        payload = {**payload, "id": part["id"]}
    return payload if isinstance(payload, list) else [payload]


def _keys(part: dict[str, Any]) -> str:
    """The keys that hold something (through Arrow, every part has every part's keys, as None)."""
    return ", ".join(sorted(str(k) for k, v in part.items() if v is not None))
