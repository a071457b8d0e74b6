"""The tools' argument check against the MCP SDK itself, in process: it leans on the SDK's internals
(rag/api/mcp/arguments.py), so an SDK upgrade that changes them fails here, not in a user's host."""

from typing import Annotated

import anyio
from mcp import Client, MCPError
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools.base import Tool
from mcp_types import INVALID_PARAMS, TextContent
from pydantic import Field

from rag.api.mcp.arguments import ArgumentCheck


def lookup(term: Annotated[str, Field(max_length=20)], tags: list[str] | None = None, top_k: int = 5) -> str:
    """A tool with a bounded string, a list and a number."""
    return f"{term} {tags or []} {top_k}"


def served(arguments: dict[str, object]) -> str | MCPError:
    """What `lookup` answers over an in-process MCP session with the check in place: its text, or the
    JSON-RPC error the call got."""
    tools = {"lookup": Tool.from_function(lookup)}
    server = MCPServer("check", tools=list(tools.values()), middleware=[ArgumentCheck(tools)])

    async def main() -> str | MCPError:
        async with Client(server) as client:
            try:
                result = await client.call_tool("lookup", arguments)
            except MCPError as exc:
                return exc
            (content,) = result.content
            assert isinstance(content, TextContent) and not result.is_error
            return content.text

    return anyio.run(main)


def test_arguments_that_break_the_schema_are_an_invalid_params_error_naming_each_field() -> None:
    refused = served({"term": "x" * 21, "top_k": "many"})
    assert isinstance(refused, MCPError) and refused.error.code == INVALID_PARAMS
    assert refused.error.data == {"fields": ["term", "top_k"]}
    assert "term: String should have at most 20 characters" in refused.error.message


def test_a_missing_argument_is_named() -> None:
    refused = served({"top_k": 3})
    assert isinstance(refused, MCPError) and refused.error.code == INVALID_PARAMS
    assert refused.error.data == {"fields": ["term"]}


def test_arguments_the_sdk_accepts_pass_the_check_as_the_sdk_reads_them() -> None:
    """A list sent as a JSON string is parsed by the SDK before validation: the check must parse it too."""
    assert served({"term": "kettle", "tags": '["a", "b"]', "top_k": "3"}) == "kettle ['a', 'b'] 3"
