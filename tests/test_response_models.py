"""Every route says what it answers: a response model (so /v1/openapi.json gives its JSON schema), or,
for a body that is not JSON (a PNG page, an SSE stream, a 204), that body in its `responses`."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

import pytest
from fastapi import APIRouter
from fastapi.routing import APIRoute
from pydantic import BaseModel

import rag.api.routes
from rag.api.app import create_app
from rag.core.config import Settings


def described_routes() -> list[APIRoute]:
    """The routes of every module of rag/api/routes that the schema shows (the page, its files and
    /metrics are left out of it)."""
    found = []
    for module in pkgutil.iter_modules(rag.api.routes.__path__):
        router = getattr(importlib.import_module(f"rag.api.routes.{module.name}"), "router", None)
        if isinstance(router, APIRouter):
            found += [r for r in router.routes if isinstance(r, APIRoute) and r.include_in_schema]
    return found


def non_json_bodies(route: APIRoute) -> dict[str, list[str]]:
    """The statuses whose body `responses` documents as something else than JSON (a 204 has none)."""
    found: dict[str, list[str]] = {}
    for status, spec in route.responses.items():
        content: dict[str, Any] = spec.get("content", {})
        if str(status) == "204" and spec.get("description"):
            found["204"] = []
        elif any(kind != "application/json" for kind in content):
            found[str(status)] = [kind for kind in content if kind != "application/json"]
    return found


def test_the_routes_of_every_module_are_read():
    paths = {r.path for r in described_routes()}
    assert {"/health", "/documents", "/chat", "/store/check", "/documents/{doc_id}/pages/{page}"} <= paths
    assert len(paths) >= 15, sorted(paths)


@pytest.mark.parametrize("route", described_routes(), ids=lambda r: f"{sorted(r.methods)[0]} {r.path}")
def test_every_route_has_a_response_model_or_documents_its_other_body(route: APIRoute):
    success = str(route.status_code or 200)
    if isinstance(route.response_model, type) and issubclass(route.response_model, BaseModel):
        return  # a `dict[str, Any]` is a response model to FastAPI, but it says nothing of the fields
    assert success in non_json_bodies(route), (
        f"{route.path} ({route.endpoint.__module__}.{route.endpoint.__name__}) returns an untyped body: give it a "
        f"response model, or describe its non-JSON {success} body in `responses=`"
    )


def test_the_schema_describes_the_json_of_every_route():
    schema = create_app(Settings()).openapi()
    untyped = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            for status, answer in operation["responses"].items():
                json_body = answer.get("content", {}).get("application/json")
                if json_body is not None and "$ref" not in json_body.get("schema", {}):
                    untyped.append(f"{method.upper()} {path} {status}")
    assert untyped == [], "responses whose JSON the schema does not name a model for"
