"""The instance metadata services of AWS, Google Cloud and Azure, as far as spot notices go.

One HTTP server answers all three, as each cloud does at 169.254.169.254, including what
each refuses: AWS IMDSv2 (a token from ``PUT /latest/api/token`` is required, answering 401
without it), Google's ``Metadata-Flavor: Google`` and Azure's ``Metadata: true`` headers
(400 without them). :meth:`CloudMetadata.notice` makes the cloud announce the reclaim.

Shapes, from the clouds' documentation:

- AWS ``GET /latest/meta-data/spot/instance-action``: 404 until a notice, then
  ``{"action": "terminate", "time": "2026-11-26T14:30:00Z"}``.
- GCP ``GET /computeMetadata/v1/instance/preempted``: ``FALSE``, then ``TRUE``.
- Azure ``GET /metadata/scheduledevents?api-version=2020-07-01``: ``{"DocumentIncarnation": n,
  "Events": [...]}``, with an event of ``EventType: Preempt`` once noticed.
"""

from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


class CloudMetadata:
    def __init__(self) -> None:
        self.noticed: set[str] = set()
        self.tokens: set[str] = set()
        self.asked: list[tuple[str, str]] = []  # (method, path) of every request
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> CloudMetadata:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def notice(self, provider: str) -> None:
        """The cloud reclaims this VM soon: ``aws``, ``gcp`` or ``azure`` says so from now on."""
        self.noticed.add(provider)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        cloud = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def answer(self, status: int, body: str = "", kind: str = "text/plain") -> None:
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_PUT(self) -> None:  # noqa: N802
                cloud.asked.append(("PUT", self.path))
                if self.path != "/latest/api/token" or not self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    return self.answer(400, "missing X-aws-ec2-metadata-token-ttl-seconds")
                token = secrets.token_urlsafe(16)
                cloud.tokens.add(token)
                self.answer(200, token)

            def do_GET(self) -> None:  # noqa: N802
                cloud.asked.append(("GET", self.path))
                path = urlsplit(self.path).path
                if path == "/latest/meta-data/spot/instance-action":
                    if self.headers.get("X-aws-ec2-metadata-token") not in cloud.tokens:
                        return self.answer(401)
                    if "aws" not in cloud.noticed:
                        return self.answer(404, "Not Found")
                    return self.answer(
                        200, json.dumps({"action": "terminate", "time": "2026-11-26T14:30:00Z"}), "application/json"
                    )
                if path == "/computeMetadata/v1/instance/preempted":
                    if self.headers.get("Metadata-Flavor") != "Google":
                        return self.answer(403, "Missing Metadata-Flavor:Google header.")
                    return self.answer(200, "TRUE" if "gcp" in cloud.noticed else "FALSE")
                if path == "/metadata/scheduledevents":
                    if self.headers.get("Metadata") != "true":
                        refused = {"error": "Bad request. Required metadata header not specified"}
                        return self.answer(400, json.dumps(refused))
                    events = [
                        {
                            "EventId": "602d9444-d2cd-49c7-8624-8643e7171297",
                            "EventType": "Preempt",
                            "ResourceType": "VirtualMachine",
                            "Resources": ["spot-vm"],
                            "EventStatus": "Scheduled",
                            "NotBefore": "Thu, 26 Nov 2026 14:30:00 GMT",
                            "EventSource": "Platform",
                        }
                    ]
                    body = {
                        "DocumentIncarnation": 2 if "azure" in cloud.noticed else 1,
                        "Events": events if "azure" in cloud.noticed else [],
                    }
                    return self.answer(200, json.dumps(body), "application/json")
                self.answer(404, "Not Found")

        return Handler
