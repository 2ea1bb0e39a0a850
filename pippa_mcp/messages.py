"""Answers to JSON-RPC messages the MCP SDK cannot read or would drop.

``invalid_request_id`` (the HTTP door, ``pippa_mcp.asgi``) and
``unreadable_answer`` (stdio, ``pippa_mcp.server.serve_stdio``).
"""

from __future__ import annotations

import json
import math

from mcp.shared.message import SessionMessage
from mcp.types import (
    PARSE_ERROR,
    ErrorData,
    JSONRPCError,
)
from pydantic import ValidationError

ERR_REQUEST_ID = (
    "Invalid Request: a request's id must be a string or an integer (not null),"
    " not {id}"
)
ERR_UNREADABLE = (
    "the message could not be read ({reason}); if its arguments are deeply"
    " nested, send flatter JSON"
)


# -- stdio ------------------------------------------------------------------------------


def _request_id(line: str) -> int | str | None:
    """The id of the request on ``line`` when Python's own parser can read it."""
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if isinstance(message, dict) and "method" in message:
        found = message.get("id")
        if isinstance(found, str) or (
            isinstance(found, int) and not isinstance(found, bool)
        ):
            return found
    return None


def invalid_request_id(body: bytes) -> str | None:
    """Why a request in ``body`` has an id JSON-RPC does not allow, or None.

    MCP's ids are strings or integers, never null; a request whose id is
    null, a fraction or NaN would otherwise be taken for a notification (the
    SDK parses it so) and dropped without an answer. The door answers it
    with JSON-RPC's Invalid Request error and a null id instead.
    """
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None  # not JSON: the SDK answers the parse error
    messages = message if isinstance(message, list) else [message]
    for item in messages:
        if not isinstance(item, dict) or "method" not in item or "id" not in item:
            continue
        found = item["id"]
        if isinstance(found, str) or (
            isinstance(found, int) and not isinstance(found, bool)
        ):
            continue
        if isinstance(found, float) and math.isfinite(found) and found.is_integer():
            continue  # 7.0 is the integer 7, as the SDK reads it
        return ERR_REQUEST_ID.format(id=json.dumps(found)[:40])
    return None


def unreadable_answer(exc: Exception) -> SessionMessage | None:
    """The error answer to a line the SDK could not parse, or None.

    The SDK's stdio reader passes such a line on as an exception, which the
    session drops: the client would wait for ever. Its parser stops at 200
    levels of nesting where Python's reads on, so the request's id can still
    be found and answered (JSON-RPC's parse error, with that id).
    """
    if not isinstance(exc, ValidationError):
        return None
    errors = exc.errors()
    if not errors or errors[0].get("type") != "json_invalid":
        return None
    line = errors[0].get("input")
    request_id = _request_id(line) if isinstance(line, str) else None
    if request_id is None:
        return None
    reason = str(errors[0].get("msg", "invalid JSON")).removeprefix("Invalid JSON: ")
    return SessionMessage(
        JSONRPCError(
            jsonrpc="2.0",
            id=request_id,
            error=ErrorData(
                code=PARSE_ERROR, message=ERR_UNREADABLE.format(reason=reason)
            ),
        )
    )
