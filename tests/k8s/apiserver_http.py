"""HTTP for the test API server (apiserver.py): routes, JSON bodies, chunked watch streams."""

from __future__ import annotations

import copy
import json
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.k8s import pod_logs
from tests.k8s.apiserver import ApiServer
from tests.k8s.errors import ApiError
from tests.k8s.objects import RESOURCES, Request, flag
from tests.k8s.schemas import K8S_VERSION

_PATH = re.compile(
    r"^/(?:api/v1|apis/coordination\.k8s\.io/v1)/namespaces/(?P<ns>[^/]+)/(?P<resource>[a-z]+)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>status|binding|log))?$"
)
_SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


class Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that went away (a watch closed, a stopped provider): not news


class Handler(BaseHTTPRequestHandler):
    api: ApiServer
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        self.api._sockets.add(self.connection)

    def finish(self) -> None:
        self.api._sockets.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log is `ApiServer.requests`

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    def _serve(self) -> None:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        request = Request(self.command, url.path, query, body)
        self.api.requests.append(request)
        try:
            if flag(query.get("watch")) and self.command == "GET":
                m = _PATH.match(url.path)
                if m is None or m["name"]:
                    raise ApiError(404, "NotFound", url.path)
                request.status = 200
                self._stream(lambda send: self.api.watch(m["resource"], m["ns"], query, send))
                return
            m = _PATH.match(url.path)
            if m is not None and m["sub"] == "log" and m["resource"] == "pods":
                if self.command != "GET":
                    raise ApiError(405, "MethodNotAllowed", f"{self.command} {url.path}")
                request.status = 200
                pod_logs.serve(self, m["ns"], m["name"], query)
                return
            code, answer = self._route(url.path, query, body)
        except ApiError as exc:
            code, answer = exc.code, exc.status()
        request.status = code
        data = json.dumps(answer).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self, path: str, query: dict[str, str], body: Any) -> tuple[int, dict[str, Any]]:
        api, method = self.api, self.command
        if path == "/version":
            return 200, {
                "major": "1",
                "minor": K8S_VERSION.split(".")[1],
                "gitVersion": f"v{K8S_VERSION}.0",
            }
        if path == "/api":
            return 200, {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [],
            }
        if path == "/apis":
            groups = [
                {"name": g, "versions": [{"groupVersion": f"{g}/v1", "version": "v1"}],
                 "preferredVersion": {"groupVersion": f"{g}/v1", "version": "v1"}}
                for g in ("coordination.k8s.io", "authorization.k8s.io")
            ]  # fmt: skip
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        if path == _SSAR and method == "POST":
            return 201, api.review(_object(body))
        m = _PATH.match(path)
        if m is None or m["resource"] not in RESOURCES:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource {path}"
            )
        resource, ns, name, sub = m["resource"], m["ns"], m["name"], m["sub"]
        if (m["resource"] == "leases") != path.startswith("/apis/coordination.k8s.io/"):
            raise ApiError(404, "NotFound", path)
        if sub and resource != "pods":
            raise ApiError(404, "NotFound", path)
        if name is None:
            if method == "GET":
                return 200, api.list(resource, ns, query.get("labelSelector", ""))
            if method == "POST":
                return 201, api.create(resource, ns, _object(body), query)
        elif sub == "binding" and method == "POST":
            return 201, api.bind(ns, name, _object(body))
        elif method == "GET" and sub is None:
            with api._cond:
                return 200, copy.deepcopy(api._current(resource, ns, name))
        elif method == "PUT":
            return 200, api.replace(resource, ns, name, _object(body), sub)
        elif method == "PATCH" and sub is None:
            content_type = (self.headers.get("Content-Type") or "").split(";")[0]
            return 200, api.patch(resource, ns, name, body, content_type)
        elif method == "DELETE" and sub is None:
            grace = Request(method, path, query, body).grace_s()
            return 200, api.delete(resource, ns, name, grace)
        raise ApiError(405, "MethodNotAllowed", f"{method} {path}")

    def _stream(self, run: Any) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(event: dict[str, Any]) -> None:
            line = json.dumps(event).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()

        try:
            run(send)
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            self.close_connection = True


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "BadRequest", "the body is not a JSON object")
    return body
