"""Where and how to connect: target, TLS, bearer token, channel options."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

import grpc

#: A PEM file path, or the PEM contents as bytes.
PemSource = Union[str, "os.PathLike[str]", bytes]

# gRPC's own reconnect backoff grows to 120 s, and while a channel waits in it
# every call fails at once: a worker would sit idle for minutes after a broker
# restart. Capped at the Worker's default backoff_max instead.
_CHANNEL_DEFAULTS: Tuple[Tuple[str, Any], ...] = (("grpc.max_reconnect_backoff_ms", 10_000),)


def _pem(source: Optional[PemSource], what: str) -> Optional[bytes]:
    if source is None:
        return None
    if isinstance(source, bytes):
        return source
    try:
        with open(source, "rb") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"tls.{what}: cannot read {os.fspath(source)!r}: {e.strerror}") from e


@dataclass(frozen=True)
class TLS:
    """TLS settings for a connection to a broker served with ``--tls-cert``.

    - ``ca``: the CA certificate(s) that signed the broker's certificate;
      None = the system's roots.
    - ``cert`` and ``key``: this client's certificate chain and private key,
      for a broker with ``--tls-client-ca`` (mutual TLS). Both or neither.
    - ``server_name``: the name to verify the broker's certificate against,
      when it differs from the host in the target (e.g. connecting by IP).

    Each of ``ca``, ``cert`` and ``key`` is a file path or the PEM bytes.
    """

    ca: Optional[PemSource] = None
    cert: Optional[PemSource] = None
    key: Optional[PemSource] = None
    server_name: Optional[str] = None

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.cert is None) != (self.key is None):
            raise ValueError("tls: cert and key go together (mutual TLS needs both)")
        return grpc.ssl_channel_credentials(
            root_certificates=_pem(self.ca, "ca"),
            private_key=_pem(self.key, "key"),
            certificate_chain=_pem(self.cert, "cert"),
        )


class Connection:
    """The settings every client is built from; see :class:`leaseq.Client`."""

    def __init__(
        self,
        target: str,
        *,
        token: Optional[str] = None,
        tls: Union[TLS, bool, None] = None,
        options: Sequence[Tuple[str, Any]] = (),
    ) -> None:
        scheme, sep, rest = target.partition("://")
        if sep:
            if scheme not in ("http", "https"):
                raise ValueError(f"target: unknown scheme {scheme!r} (use host:port, http:// or https://)")
            if scheme == "http" and tls:
                raise ValueError("target: http:// is plaintext, but tls was given")
            if scheme == "https" and tls is None:
                tls = True
            target = rest.rstrip("/")
        self.target = target
        self.tls: Optional[TLS] = TLS() if tls is True else (tls or None)
        self.token = token
        if token is not None and (not token or any(c in token for c in "\r\n")):
            raise ValueError("token: must be a non-empty single line")
        opts = dict(_CHANNEL_DEFAULTS)
        if self.tls is not None and self.tls.server_name:
            opts["grpc.ssl_target_name_override"] = self.tls.server_name
        opts.update(dict(options))
        self.options: List[Tuple[str, Any]] = list(opts.items())
        self.metadata: Tuple[Tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        # Built once: reading the PEM files is the slow part.
        self._creds = self.tls.credentials() if self.tls is not None else None

    def sync_channel(self) -> grpc.Channel:
        if self._creds is None:
            return grpc.insecure_channel(self.target, options=self.options)
        return grpc.secure_channel(self.target, self._creds, options=self.options)

    def aio_channel(self) -> "grpc.aio.Channel":
        if self._creds is None:
            return grpc.aio.insecure_channel(self.target, options=self.options)
        return grpc.aio.secure_channel(self.target, self._creds, options=self.options)
