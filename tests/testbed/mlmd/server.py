"""gRPC front for the ML Metadata store, for the KFP 2.14.3 backend in the trainflow test bed.

KFP 2.14.3's driver and launcher record executions and artifacts in ML Metadata through its gRPC
API (``ml_metadata.MetadataStoreService``, the metadata-grpc-service of a KFP install). Upstream
serves it with a C++ binary (``metadata_store_server``) that no package registry ships. PyPI's
``ml-metadata`` wheel ships the same store library (``metadata_store_extension``, the C++ store the
server wraps, over SQLite or MySQL) and the service's proto stubs, but not the server. This module
is trainflow's server around that library: every RPC of the service whose method the library
exposes is passed through unchanged — the request's bytes go to the library's function of the same
name, and its response bytes (or its status code and message, which are gRPC codes: absl::Status)
go back. Nothing is interpreted here, so the store behaves as upstream's server would, with these
differences:

* ``GetParentContextsByContexts``, ``GetChildrenContextsByContexts`` and ``GetLineageGraph`` are
  not in the library's Python binding and answer UNIMPLEMENTED (KFP's driver and launcher do not
  call them);
* calls are serialized by one lock (the store object is not documented as thread-safe);
* it listens on exactly one address, given on the command line (the test bed passes the host end
  of its node's veth, so pods reach it, or 127.0.0.1).

It runs under the venv that ``tests/testbed/build.sh mlmd`` makes (ml-metadata needs protobuf<5;
the project's venv has protobuf 6), so it imports nothing from trainflow.

Usage::

    python tests/testbed/mlmd/server.py --listen HOST:PORT \\
        (--sqlite PATH | --mysql-host H --mysql-port P --mysql-database DB --mysql-user U
         [--mysql-password-file F])

It prints ``MLMD_READY HOST:PORT`` on stdout once it serves, and stops on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc
from ml_metadata.metadata_store.pywrap.metadata_store_extension import metadata_store as store_lib
from ml_metadata.proto import metadata_store_pb2, metadata_store_service_pb2

SERVICE = metadata_store_service_pb2.DESCRIPTOR.services_by_name["MetadataStoreService"]


def _connection_config(args: argparse.Namespace) -> metadata_store_pb2.ConnectionConfig:
    config = metadata_store_pb2.ConnectionConfig()
    if args.sqlite:
        config.sqlite.filename_uri = args.sqlite
        config.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READWRITE_OPENCREATE
    else:
        config.mysql.host = args.mysql_host
        config.mysql.port = args.mysql_port
        config.mysql.database = args.mysql_database
        config.mysql.user = args.mysql_user
        if args.mysql_password_file:
            config.mysql.password = Path(args.mysql_password_file).read_text().strip()
    return config


class StoreHandler(grpc.GenericRpcHandler):
    """Passes each unary RPC of MetadataStoreService to the store library's function of that name."""

    def __init__(self, store: object) -> None:
        self._store = store
        self._lock = threading.Lock()
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method in SERVICE.methods:
            self._handlers[f"/{SERVICE.full_name}/{method.name}"] = grpc.unary_unary_rpc_method_handler(
                self._pass_through(method.name)
            )

    def _pass_through(self, name: str):
        function = getattr(store_lib, name, None)

        def behaviour(request: bytes, context: grpc.ServicerContext) -> bytes:
            if function is None:
                context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not in ml-metadata's Python binding")
            with self._lock:
                response, error_message, status_code = function(self._store, request)
            if status_code != 0:
                code = next(
                    (c for c in grpc.StatusCode if c.value[0] == status_code), grpc.StatusCode.UNKNOWN
                )
                context.abort(code, error_message.decode("utf-8", "replace"))
            return response

        return behaviour

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return self._handlers.get(handler_call_details.method)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT to serve on")
    parser.add_argument("--sqlite", help="SQLite file of the store")
    parser.add_argument("--mysql-host")
    parser.add_argument("--mysql-port", type=int, default=3306)
    parser.add_argument("--mysql-database", default="metadb")
    parser.add_argument("--mysql-user", default="root")
    parser.add_argument("--mysql-password-file")
    parser.add_argument("--workers", type=int, default=8, help="gRPC worker threads")
    args = parser.parse_args(argv)
    if bool(args.sqlite) == bool(args.mysql_host):
        parser.error("give exactly one of --sqlite and --mysql-host")

    migration = metadata_store_pb2.MigrationOptions(enable_upgrade_migration=True)
    store = store_lib.CreateMetadataStore(
        _connection_config(args).SerializeToString(), migration.SerializeToString()
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=args.workers))
    server.add_generic_rpc_handlers((StoreHandler(store),))
    if server.add_insecure_port(args.listen) == 0:
        print(f"mlmd server: cannot listen on {args.listen}", file=sys.stderr)
        return 1
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(f"MLMD_READY {args.listen}", flush=True)
    stop.wait()
    server.stop(grace=2).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
