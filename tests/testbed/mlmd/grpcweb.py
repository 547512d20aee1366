"""gRPC-Web front of the ML Metadata server, for the KFP UI in the trainflow test bed.

The KFP UI reads a v2 run's task states from ML Metadata in the browser, with gRPC-Web
(``grpc-web`` ``mode=grpcweb``: ``POST /ml_metadata.MetadataStoreService/<Method>``, content type
``application/grpc-web+proto``); its Node server passes every ``/ml_metadata.*`` request on to
``METADATA_ENVOY_SERVICE_SERVICE_HOST:PORT``. In a KFP install that is Envoy
(``metadata-envoy-deployment``, its ``grpc_web`` filter in front of metadata-grpc-service). Envoy is
on no package registry, so this is the test bed's stand-in for that one filter: each request's
message goes unchanged to the ML Metadata gRPC server (``tests/testbed/mlmd/server.py``) as a unary
call of the same path, and the response message (or the gRPC status) comes back as gRPC-Web frames:
a data frame (flag 0x00) and a trailer frame (flag 0x80, ``grpc-status``/``grpc-message``). Both
binary (``application/grpc-web``, ``+proto``) and base64 (``application/grpc-web-text``) bodies are
answered. Only unary calls (all the UI makes) are supported.

It needs only ``grpcio`` (it runs under the ML Metadata venv of ``build.sh kfp``) and imports
nothing from trainflow.

Usage::

    python tests/testbed/mlmd/grpcweb.py --listen 127.0.0.1:PORT --mlmd HOST:PORT

It prints ``GRPCWEB_READY HOST:PORT`` on stdout once it serves, and stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import base64
import signal
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote

import grpc

SERVICE_PREFIX = "/ml_metadata.MetadataStoreService/"
CALL_TIMEOUT_S = 60.0


def frame(flag: int, payload: bytes) -> bytes:
    return struct.pack(">BI", flag, len(payload)) + payload


def first_message(body: bytes) -> bytes:
    """The message of the body's first data frame (a unary request has exactly one)."""
    offset = 0
    while offset + 5 <= len(body):
        flag, length = struct.unpack(">BI", body[offset : offset + 5])
        payload = body[offset + 5 : offset + 5 + length]
        if flag & 0x80 == 0:
            return payload
        offset += 5 + length
    return b""


def make_handler(channel: grpc.Channel) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            sys.stdout.write(f"{self.address_string()} {format % args}\n")
            sys.stdout.flush()

        def do_OPTIONS(self) -> None:  # CORS preflight (the UI is same-origin; harmless)
            self.send_response(204)
            self.send_header("Access-Control-Allow-Origin", self.headers.get("Origin", "*"))
            self.send_header("Access-Control-Allow-Methods", "POST, OPTIONS")
            self.send_header("Access-Control-Allow-Headers", self.headers.get("Access-Control-Request-Headers", "*"))
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            content_type = (self.headers.get("Content-Type") or "application/grpc-web+proto").split(";")[0]
            text = content_type.startswith("application/grpc-web-text")
            if text:
                body = base64.b64decode(body)
            if not self.path.startswith(SERVICE_PREFIX):
                self._reply(content_type, text, b"", 12, f"unknown service in {self.path}")  # UNIMPLEMENTED
                return
            call = channel.unary_unary(self.path)  # bytes in, bytes out: no (de)serializer
            try:
                response = call(first_message(body), timeout=CALL_TIMEOUT_S)
            except grpc.RpcError as err:
                code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
                details = err.details() if hasattr(err, "details") else str(err)
                self._reply(content_type, text, b"", code.value[0], details or "")
                return
            self._reply(content_type, text, frame(0x00, response), 0, "")

        def _reply(self, content_type: str, text: bool, data: bytes, status: int, message: str) -> None:
            trailer = f"grpc-status:{status}\r\ngrpc-message:{quote(message, safe='')}\r\n".encode()
            payload = data + frame(0x80, trailer)
            if text:
                payload = base64.b64encode(payload)
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(payload)))
            self.send_header("Access-Control-Allow-Origin", self.headers.get("Origin", "*"))
            self.send_header("Access-Control-Expose-Headers", "grpc-status,grpc-message")
            self.end_headers()
            self.wfile.write(payload)

    return Handler


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to serve gRPC-Web on")
    parser.add_argument("--mlmd", required=True, help="HOST:PORT of the ML Metadata gRPC server")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    channel = grpc.insecure_channel(args.mlmd)
    server = ThreadingHTTPServer((host, int(port)), make_handler(channel))
    server.daemon_threads = True

    def stop(*_: object) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"GRPCWEB_READY {host}:{server.server_address[1]}", flush=True)
    server.serve_forever()
    channel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
