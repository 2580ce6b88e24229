"""What every HTTP answer goes through, whatever its route: the request's id, aiohttp's own refusals as JSON
errors, and CORS headers (a browser's preflight answered) for the allowed origins."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from server.operations.access import REQUEST_ID_HEADER, request_id

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
REQUEST_ID = web.RequestKey("request_id", str)
# How long a browser may reuse a preflight's answer; browsers cap it themselves (Chromium at 2 hours).
CORS_MAX_AGE_S = 24 * 3600
CORS_HEADERS = {
    "Access-Control-Allow-Methods": "GET, POST, DELETE",
    "Access-Control-Allow-Headers": f"Authorization, Content-Type, {REQUEST_ID_HEADER}, traceparent",
    "Access-Control-Expose-Headers": f"X-Translation-Model, {REQUEST_ID_HEADER}, Retry-After",
    "Access-Control-Max-Age": str(CORS_MAX_AGE_S),
}


def error_response(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


@web.middleware
async def request_ids(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The caller's X-Request-ID (or a new one) for the handler's record, and back on every response."""
    request[REQUEST_ID] = request_id(request.headers.get(REQUEST_ID_HEADER))
    try:
        response = await handler(request)
    except web.HTTPException as error:
        error.headers[REQUEST_ID_HEADER] = request[REQUEST_ID]
        raise
    response.headers[REQUEST_ID_HEADER] = request[REQUEST_ID]
    return response


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own refusals (unknown path, wrong method, body too large) as JSON errors too."""
    try:
        return await handler(request)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return error_response(error.status, error.reason)


def cors(origins: tuple[str, ...]) -> Callable:
    """CORS on every answer for ``origins`` ("*": any), a preflight (OPTIONS) on a route answered 204."""

    def headers_for(request: web.Request) -> dict[str, str]:
        origin = request.headers.get("Origin", "")
        if "*" in origins:
            return {"Access-Control-Allow-Origin": "*", **CORS_HEADERS}
        if origin in origins:
            return {"Access-Control-Allow-Origin": origin, "Vary": "Origin", **CORS_HEADERS}
        return {}

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        unrouted = request.match_info.http_exception
        if request.method == "OPTIONS" and (unrouted is None or unrouted.status == 405):
            return web.Response(status=204, headers=headers_for(request))
        try:
            response = await handler(request)
        except web.HTTPException as error:
            error.headers.update(headers_for(request))
            raise
        response.headers.update(headers_for(request))
        return response

    return middleware
