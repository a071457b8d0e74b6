"""The tools' argument check, and the one place that reads the MCP SDK's internals.

The SDK validates a tools/call's arguments only when it calls the tool, and turns a failure into an
`is_error` result; ArgumentCheck (middleware) validates them first, against the same model by the same
steps, so bad arguments are a JSON-RPC -32602 error naming the fields, before any work. Those steps are
not public API: `Tool.fn_metadata.arg_model` and `pre_parse_json` (which parses a JSON string sent
for a list or object argument). tests/test_mcp_arguments.py fails if an SDK upgrade changes them.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver.tools.base import Tool
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import ValidationError


def check_arguments(tool: Tool, arguments: dict[str, Any]) -> None:
    """Raise ValidationError when `arguments` break `tool`'s schema, as the SDK judges them when it calls it."""
    metadata = tool.fn_metadata
    metadata.arg_model.model_validate(metadata.pre_parse_json(arguments))


class ArgumentCheck:
    """Middleware: a tools/call whose arguments break the tool's schema is a JSON-RPC error naming the
    fields, before any work (the SDK would make it an `is_error` result)."""

    def __init__(self, tools: dict[str, Tool]) -> None:
        self.tools = tools

    async def __call__(self, ctx: Any, call_next: Any) -> Any:
        params = ctx.params if isinstance(ctx.params, dict) else {}
        tool = self.tools.get(str(params.get("name"))) if ctx.method == "tools/call" else None
        arguments = params.get("arguments") or {}
        if tool is not None and isinstance(arguments, dict):
            try:
                check_arguments(tool, arguments)
            except ValidationError as exc:
                raise invalid_arguments(exc) from None
        return await call_next(ctx)


def invalid_arguments(exc: ValidationError) -> MCPError:
    """-32602 naming each field and what is wrong with it (not the value, which may be huge)."""
    problems = [(".".join(str(p) for p in e["loc"]) or "arguments", e["msg"]) for e in exc.errors()[:10]]
    message = "invalid arguments: " + "; ".join(f"{field}: {msg}" for field, msg in problems)
    return MCPError(code=INVALID_PARAMS, message=message, data={"fields": [f for f, _ in problems]})
