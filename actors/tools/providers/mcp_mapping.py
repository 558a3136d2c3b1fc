"""MCP's tools and answers as loopd's: specs with their policy, results as text, messages.

Pure functions (the MCP provider, :mod:`actors.tools.providers.mcp`, calls them). The
policy: a server's annotations are hints from a program we did not write, so they only ever
choose the stricter side of MCP's defaults, and only loopd's config allows a tool:

- approval: a tool runs without approval only if it says ``readOnlyHint: true`` and does
  not also say ``destructiveHint: true``. Everything else (no annotations, additive writes
  with ``destructiveHint: false``, destructive tools) needs approval unless a rule
  (``tools.allow``, the rules file) allows it. This is stricter than keying on
  ``destructiveHint`` alone: an additive write (``git_commit``) changes things, like
  loopd's own ``write_file``.
- untrusted: results are untrusted unless the tool says ``openWorldHint: false`` (MCP's
  default is true). ``tools.allow`` never makes results trusted.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types

from actors.base.textcut import cut
from actors.tools.protocol.spec import ResultClass, ToolSpec
from actors.tools.protocol.wire import Answer, Failed, Result

__all__ = [
    "RESOURCE_TOOL",
    "answer_of",
    "cut_text",
    "describe_content",
    "policy",
    "reason",
    "resource_spec",
    "result_text",
    "strip_userinfo",
    "timeout_message",
    "tool_spec",
]


def policy(annotations: mcp_types.ToolAnnotations | None) -> tuple[bool, bool]:
    """``(needs_approval, untrusted)`` for a tool with these MCP annotations.

    Missing hints take MCP's defaults (readOnly false, destructive true, openWorld true),
    so a tool that says nothing needs approval and returns untrusted results.
    """
    hints = annotations or mcp_types.ToolAnnotations()
    read_only = hints.read_only_hint is True and hints.destructive_hint is not True
    untrusted = hints.open_world_hint is not False
    return not read_only, untrusted


def tool_spec(tool: mcp_types.Tool) -> ToolSpec:
    """The loopd ToolSpec for an MCP tool (approval before ``tools.allow`` is applied)."""
    needs_approval, untrusted = policy(tool.annotations)
    title = tool.title or (tool.annotations.title if tool.annotations else None)
    description = tool.description or title or f"{tool.name} (an MCP tool without a description)"
    return ToolSpec(
        name=tool.name,
        description=description,
        parameters=json.loads(json.dumps(tool.input_schema)),  # plain JSON data for the wire
        result_class=ResultClass.PUBLIC,
        needs_approval=needs_approval,
        untrusted=untrusted,
    )


RESOURCE_TOOL = "read_resource"
_RESOURCES_SHOWN = 20


def resource_spec(
    resources: list[mcp_types.Resource], label: str, tool_names: set[str]
) -> ToolSpec | None:
    """A ``read_resource(uri)`` tool for a server's resources (None: it has none, or a tool
    of its own has the name). Their contents are untrusted: outside text."""
    if not resources or RESOURCE_TOOL in tool_names:
        return None
    shown = [f"{r.uri} ({r.name}{': ' + r.description if r.description else ''})"
             for r in resources[:_RESOURCES_SHOWN]]
    more = len(resources) - len(shown)
    listing = "; ".join(shown) + (f"; and {more} more" if more > 0 else "")
    return ToolSpec(
        name=RESOURCE_TOOL,
        description=f"Read a resource of MCP server {label} by its uri. Resources: {listing}",
        parameters={"type": "object", "properties": {"uri": {
            "type": "string", "description": "the resource's uri, as listed"}},
            "required": ["uri"], "additionalProperties": False},
        result_class=ResultClass.PUBLIC, needs_approval=False, untrusted=True,
    )


def _b64_size(data: str) -> int:
    """Decoded size of base64 text, without decoding it."""
    data = data.strip()
    return max(0, len(data) * 3 // 4 - data[-2:].count("="))


def _size(n: int | None) -> str:
    return "size unknown" if n is None else f"{n:,} bytes"


def describe_content(block: Any) -> str:
    """One MCP content block as text: text as is; anything else described, never dropped."""
    kind = getattr(block, "type", type(block).__name__)
    if isinstance(block, mcp_types.TextContent):
        return block.text
    if isinstance(block, mcp_types.ImageContent | mcp_types.AudioContent):
        return f"[{kind}: {block.mime_type}, {_size(_b64_size(block.data))}; not shown]"
    if isinstance(block, mcp_types.ResourceLink):
        mime = f", {block.mime_type}" if block.mime_type else ""
        return f"[resource link: {block.uri} ({block.name}{mime}, {_size(block.size)})]"
    if isinstance(block, mcp_types.EmbeddedResource):
        res = block.resource
        mime = res.mime_type or "type unknown"
        if isinstance(res, mcp_types.TextResourceContents):
            return f"[resource {res.uri} ({mime})]\n{res.text}"
        blob = getattr(res, "blob", "")
        return f"[resource {res.uri}: {mime}, {_size(_b64_size(blob))} of binary data; not shown]"
    return f"[{kind} content; not shown]"


def result_text(result: mcp_types.CallToolResult) -> str:
    """The text of a tool result for the model.

    Structured content (checked against the tool's output schema by the SDK) reaches the
    model as compact JSON: in place of the text block that serializes it (servers are asked
    to add one for older clients), or alone when there is no text. A text block that says
    something else (a wrapped plain answer, ``{"result": "..."}``, comes with its text) is
    kept as it is.
    """
    data = result.structured_content
    compact = None if data is None else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    blocks = [
        compact if compact is not None and isinstance(b, mcp_types.TextContent)
        and _same_json(b.text, data) else describe_content(b)
        for b in result.content
    ]
    if compact is not None and not any(isinstance(b, mcp_types.TextContent)
                                       for b in result.content):
        blocks.insert(0, compact)
    return "\n".join(blocks) if blocks else "(the tool returned no content)"


def _same_json(text: str, data: Any) -> bool:
    try:
        return bool(json.loads(text) == data)
    except ValueError:
        return False


def cut_text(text: str, max_output: int | None) -> str:
    """The text cut at ``max_output`` bytes (``tools.max_output_bytes``), saying so."""
    if max_output is None:
        return text
    shown, size, total = cut(text, max_output, "bytes")
    if size == total:
        return text
    return shown + f"\n[cut: showing {size} of {total} bytes of the answer]"


def answer_of(result: mcp_types.CallToolResult, untrusted: bool, max_output: int | None) -> Answer:
    """A tool's result as the host's answer: an error result fails the call."""
    text = result_text(result)
    if result.is_error:
        return Failed(message=text)
    return Result(content=cut_text(text, max_output), class_=ResultClass.PUBLIC,
                  untrusted=untrusted)


def timeout_message(tool: str, label: str, timeout_s: float) -> str:
    return (
        f"{tool} on MCP server {label} did not answer within {timeout_s:g} s; "
        "the call was cancelled on the server"
    )


def reason(e: BaseException) -> str:
    """An exception (a group's members too) in words for a message."""
    if isinstance(e, BaseExceptionGroup):
        return "; ".join(reason(x) for x in e.exceptions)
    text = str(e)
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def strip_userinfo(url: str) -> str:
    """The url without user:password, for messages and logs."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    return f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{path}"
