"""The documents as an MCP server (Model Context Protocol, the official `mcp` SDK).

    tools:      search, ask, list_documents, list_collections
    resources:  rag://{collection}/documents/{doc_id}   a document's text

`server` declares them over a `Library` (`library`: this process's services; `remote`: a running API's
/mcp); `http` mounts the Streamable HTTP transport on the API at /mcp, and `stdio` runs `rag mcp` for
desktop clients.
"""
