"""Tool schemas and tool calls, whatever shape a row holds them in, to the shape a client sends.

A server gets tools as ``[{"type": "function", "function": {"name", "description",
"parameters"}}]`` and Kimi-K2.5's tokenizer declares exactly those TypeScript-style; anything
else (a bare ``{"name", "parameters"}`` schema, or a schema with a ``null`` where a list or an
object belongs) makes its converter fail, and the tools are then declared as JSON, a
declaration the target never saw served. So before rendering:

- a JSON string is parsed (the whole list, or each tool);
- a bare schema is wrapped as ``{"type": "function", "function": …}``;
- keys whose value is ``null`` are removed, recursively. A dataset stored through Arrow (any
  hub set loaded with `datasets`, any Parquet file) unifies nested dicts, so every schema
  carries the other tools' keys as ``null`` (``"enum": null``, a property present as
  ``null``): a property that is ``null`` is not a property.

A tool that cannot be read (no name, parameters that are not an object) skips the row with a
reason rather than render something no client sent.
"""

from __future__ import annotations

import json
from typing import Any

from remote.prep.errors import Skip


def without_nulls(value: Any) -> Any:
    """`value` with every dict key whose value is None removed, at any depth (list items are kept)."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def normalise_tools(value: Any) -> list[dict[str, Any]] | None:
    """A row's `tools` as a client sends them, or None when it has none; raises `Skip`."""
    if isinstance(value, str):
        value = _json(value, "field 'tools' is text but not JSON") if value.strip() else None
    if isinstance(value, dict):
        value = [value]
    if not value:
        return None
    if not isinstance(value, list):
        raise Skip(f"field 'tools' is {type(value).__name__}, not a list of tools")
    return [_tool(tool, i) for i, tool in enumerate(value)]


def _tool(tool: Any, index: int) -> dict[str, Any]:
    if isinstance(tool, str):
        tool = _json(tool, f"tool {index} of 'tools' is text but not JSON")
    tool = without_nulls(tool)
    if not isinstance(tool, dict):
        raise Skip(f"tool {index} of 'tools' is {type(tool).__name__}, not an object")
    if isinstance(tool.get("function"), dict):
        function = tool["function"]
    else:  # bare, or OpenAI's Responses layout ({"type": "function", "name", ...} at the top)
        function = {k: v for k, v in tool.items() if k != "type"}
    if tool.get("type", "function") != "function":
        raise Skip(f"tool {index} of 'tools' is of type {tool['type']!r}, not a function")
    name = function.get("name")
    if not isinstance(name, str) or not name.strip():
        raise Skip(f"tool {index} of 'tools' has no name")
    parameters = function.get("parameters")
    if isinstance(parameters, str):
        parameters = _json(parameters, f"parameters of tool {name!r} are text but not JSON")
        function = {**function, "parameters": without_nulls(parameters)}
    if "parameters" in function and not isinstance(function["parameters"], dict):
        raise Skip(f"parameters of tool {name!r} are not a JSON schema object")
    return {"type": "function", "function": function}


def tool_calls(raw: Any, position: int, field: str = "tool_calls") -> list[dict[str, Any]]:
    """Tool calls in OpenAI shape, arguments as a JSON string (what templates and servers expect).

    Ids are kept, else ``call_{position}_{k}`` (Kimi's own are put on later, `remote.prep.tool_ids`).
    NOTE: arguments held as an object lose their null keys too: through Arrow, every call's
    arguments carry the other calls' argument names as null.
    """
    if isinstance(raw, str):
        raw = _json(raw, f"field {field!r} is text but not JSON")
    if isinstance(raw, dict):
        raw = [raw]
    if not isinstance(raw, list):
        raise Skip(f"{field} is not a list")
    calls = []
    for k, call in enumerate(raw):
        if isinstance(call, str):
            call = _json(call, f"a call in {field} is text but not JSON")
        if not isinstance(call, dict):
            raise Skip("tool call is not an object")
        function = call.get("function") if isinstance(call.get("function"), dict) else call
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise Skip("tool call without a name")
        arguments = function.get("arguments")
        if arguments is None:
            arguments = "{}"
        elif not isinstance(arguments, str):
            arguments = json.dumps(without_nulls(arguments), ensure_ascii=False)
        call_id = call.get("id") or f"call_{position}_{k}"
        calls.append({"id": str(call_id), "type": "function", "function": {"name": name, "arguments": arguments}})
    return calls


def _json(text: str, reason: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise Skip(reason) from None
