"""What kind of output a workload request asks for (issue 24): reasoning, and tool calls.

- ``reasoning_len``: the first ``reasoning_len`` of the request's ``output_len`` tokens are the
  model's reasoning (0 <= reasoning_len <= output_len). The in-process engine splits its
  tokens so; over HTTP the request carries it as ``reasoning_tokens`` (a cbbench extension
  `cbbench serve` honours; other servers ignore it and reason as their model does).
- ``tools``: OpenAI tool definitions (``[{"type": "function", "function": {"name": ...}}]``)
  the chat request offers; ``tool_choice``: ``"auto"``, ``"required"``, ``"none"`` or
  ``{"type": "function", "function": {"name": ...}}``. A ``tool_choice`` without ``tools``
  is refused: a tool turn without tools.
"""

from __future__ import annotations

from cbbench.errors import UsageError

OUTPUT_KIND_FIELDS = {"reasoning_len", "tools", "tool_choice"}
TOOL_CHOICES = ("auto", "required", "none")


def check_reasoning_len(value: object, output_len: int, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{where}: 'reasoning_len' must be an integer, got {type(value).__name__}")
    if value < 0:
        raise UsageError(f"{where}: 'reasoning_len' must be >= 0, got {value}")
    if value > output_len:
        raise UsageError(
            f"{where}: 'reasoning_len' {value} is above 'output_len' {output_len} (the "
            "reasoning tokens are the first reasoning_len of the output)"
        )
    return value


def _tool_name(tool: object) -> str | None:
    """The function's name of an OpenAI tool definition (or a named tool_choice); None for
    anything else."""
    match tool:
        case {"type": "function", "function": {"name": str(name)}} if name:
            return name
    return None


def check_tools(tools: object, choice: object, where: str) -> tuple[tuple[dict, ...] | None, object]:
    """(tools, tool_choice) as a request sends them; UsageError on a bad pair."""
    if tools is not None:
        if (not isinstance(tools, list | tuple) or not tools
                or any(_tool_name(t) is None for t in tools)):
            raise UsageError(
                f"{where}: 'tools' must be a non-empty list of "
                '{"type": "function", "function": {"name": ...}} objects'
            )
        tools = tuple(tools)
    if choice is None:
        return tools, None
    if not tools and choice != "none":
        raise UsageError(f"{where}: 'tool_choice' without 'tools' (a tool turn needs tools)")
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise UsageError(f"{where}: 'tool_choice' must be one of {', '.join(TOOL_CHOICES)} "
                             "or a named function")
        return tools, choice
    # A named function: the 'without tools' check above raised when tools was None.
    assert tools is not None
    name = _tool_name(choice)
    if name is None or name not in {_tool_name(t) for t in tools}:
        raise UsageError(f"{where}: 'tool_choice' must name a function in 'tools'")
    return tools, choice


def parse_output_kind(obj: dict, output_len: int, where: str) -> dict:
    """The output-kind fields of one JSONL request line, checked."""
    out: dict = {}
    if "reasoning_len" in obj:
        out["reasoning_len"] = check_reasoning_len(obj["reasoning_len"], output_len, where)
    tools, choice = check_tools(obj.get("tools"), obj.get("tool_choice"), where)
    if tools is not None:
        out["tools"] = tools
    if choice is not None:
        out["tool_choice"] = choice
    return out


def request_fields(reasoning_len: int, tools, tool_choice, chat: bool) -> dict:
    """The extra body fields of one HTTP request."""
    d: dict = {}
    if reasoning_len:
        d["reasoning_tokens"] = reasoning_len
    if chat and tools:
        d["tools"] = list(tools)
        if tool_choice is not None:
            d["tool_choice"] = tool_choice
    return d
