"""Where and how to connect: target, TLS, bearer token, channel options.

Every leaseq client (this package, the Rust crate and CLI, Node, Go) takes
the same addresses and settings:

- ``host:port``: plaintext, or TLS when TLS settings are given;
  ``http://host:port``: plaintext; ``https://host:port``: TLS.
- TLS verifies the broker's certificate against the CA given, else against
  the system's roots (the file OpenSSL reads: ``SSL_CERT_FILE``, else the
  system bundle; grpc's own roots where there is none).
- What is not given comes from the environment: ``LEASEQ_ADDR`` (default
  ``127.0.0.1:50051``), ``LEASEQ_TOKEN``, ``LEASEQ_TLS_CA``,
  ``LEASEQ_CLIENT_CERT``, ``LEASEQ_CLIENT_KEY``.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

import grpc

#: The broker's address when neither the caller nor LEASEQ_ADDR gives one.
DEFAULT_ADDR = "127.0.0.1:50051"

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


def _env(name: str) -> Optional[str]:
    value = os.environ.get(name)
    return value if value else None


def system_roots() -> Optional[bytes]:
    """The system's trusted roots, as OpenSSL finds them (``SSL_CERT_FILE``,
    else the system's bundle), or None where there is no such file (grpc
    then uses the roots it ships with)."""
    paths = ssl.get_default_verify_paths()
    for path in (paths.cafile, paths.openssl_cafile):
        if path and os.path.isfile(path):
            with open(path, "rb") as f:
                return f.read()
    return None


@dataclass(frozen=True)
class TLS:
    """TLS settings for a connection to a broker served with ``--tls-cert``.

    - ``ca``: the CA certificate(s) that signed the broker's certificate;
      None = the system's roots (:func:`system_roots`).
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
        roots = _pem(self.ca, "ca") if self.ca is not None else system_roots()
        return grpc.ssl_channel_credentials(
            root_certificates=roots,
            private_key=_pem(self.key, "key"),
            certificate_chain=_pem(self.cert, "cert"),
        )


class Connection:
    """The settings every client is built from; see :class:`leaseq.Client`."""

    def __init__(
        self,
        target: Optional[str] = None,
        *,
        token: Optional[str] = None,
        tls: Union[TLS, bool, None] = None,
        options: Sequence[Tuple[str, Any]] = (),
    ) -> None:
        # What the caller leaves out, the environment gives.
        if target is None:
            target = _env("LEASEQ_ADDR") or DEFAULT_ADDR
        if token is None:
            token = _env("LEASEQ_TOKEN")
        if tls is None:
            ca, cert, key = _env("LEASEQ_TLS_CA"), _env("LEASEQ_CLIENT_CERT"), _env("LEASEQ_CLIENT_KEY")
            if ca or cert or key:
                tls = TLS(ca=ca, cert=cert, key=key)
        target = target.strip()
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
