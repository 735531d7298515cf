"""A pass-through gRPC proxy in front of a real broker that makes it look
like a broker from before ``Heartbeat.features``: the first response of
every Subscribe and Consume stream (its heartbeat) loses its ``features``.
Everything else is forwarded as bytes. It tests the SDK's old-broker path
against the current broker (as clients/node/harness/pre-batch-proxy.js
does for the Node SDK)."""

from __future__ import annotations

from concurrent import futures
from typing import Any, Iterator

import grpc

from leaseq.v1 import queue_pb2 as pb

SERVICE = "/leaseq.v1.QueueService/"


def _strip(kind: Any, first: bytes) -> bytes:
    msg = kind.FromString(first)
    if msg.WhichOneof("kind") == "heartbeat":
        del msg.heartbeat.features[:]
    return msg.SerializeToString()


class FeaturelessProxy:
    def __init__(self, target: str) -> None:
        self._upstream = grpc.insecure_channel(target)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=32))
        self._server.add_generic_rpc_handlers([_Handler(self._upstream)])
        port = self._server.add_insecure_port("127.0.0.1:0")
        self._server.start()
        self.addr = f"127.0.0.1:{port}"

    def close(self) -> None:
        self._server.stop(None).wait()
        self._upstream.close()

    def __enter__(self) -> "FeaturelessProxy":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, upstream: grpc.Channel) -> None:
        self._up = upstream

    def service(self, details: Any) -> Any:
        method = details.method
        if not method.startswith(SERVICE):
            return None
        name = method[len(SERVICE) :]
        if name == "Consume":
            call = self._up.stream_stream(method)

            def consume(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
                responses = call(requests)
                context.add_callback(responses.cancel)
                yield from _relay(pb.ConsumeResponse, responses, context)

            return grpc.stream_stream_rpc_method_handler(consume)
        if name == "Subscribe":
            call_s = self._up.unary_stream(method)

            def subscribe(request: bytes, context: Any) -> Iterator[bytes]:
                responses = call_s(request)
                context.add_callback(responses.cancel)
                yield from _relay(pb.SubscribeResponse, responses, context)

            return grpc.unary_stream_rpc_method_handler(subscribe)
        call_u = self._up.unary_unary(method)

        def unary(request: bytes, context: Any) -> bytes:
            try:
                return call_u(request)
            except grpc.RpcError as e:
                context.abort(e.code(), e.details())
                raise

        return grpc.unary_unary_rpc_method_handler(unary)


def _relay(kind: Any, responses: Any, context: Any) -> Iterator[bytes]:
    first = True
    try:
        for r in responses:
            yield _strip(kind, r) if first else r
            first = False
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.CANCELLED:
            context.abort(e.code(), e.details())
