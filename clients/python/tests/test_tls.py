"""TLS, mutual TLS and bearer tokens on every client, against a broker of
this module's own served with --tls-cert/--tls-key/--tls-client-ca and
--auth-file (certificates made here with `cryptography`)."""

import asyncio
import datetime as dt
import hashlib
import ipaddress
import json
import os
import secrets

import grpc
import pytest
from conftest import Broker
from util import queue_name, run

from leaseq import TLS, AdminClient, AsyncAdminClient, AsyncClient, Client, Job, RpcError, Worker

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402


def _key():
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _cert(subject, key, issuer_name, issuer_key, *, ca=False, sans=(), usage=None):
    now = dt.datetime.now(dt.timezone.utc)
    b = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if sans:
        b = b.add_extension(x509.SubjectAlternativeName(list(sans)), critical=False)
    if usage:
        b = b.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if ca:
        b = b.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )
    return b.sign(issuer_key, hashes.SHA256())


def _ca(name):
    key = _key()
    dn = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    return key, _cert(name, key, dn, key, ca=True)


class Pki:
    def __init__(self, d):
        pem = lambda c: c.public_bytes(serialization.Encoding.PEM)  # noqa: E731
        ca_key, ca = _ca("leaseq test CA")
        srv_key = _key()
        srv = _cert(
            "leaseq broker", srv_key, ca.subject, ca_key,
            sans=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))],
            usage=ExtendedKeyUsageOID.SERVER_AUTH,
        )  # fmt: skip
        cli_key = _key()
        cli = _cert("a worker", cli_key, ca.subject, ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
        other_key, other_ca = _ca("someone else's CA")
        self.ca = pem(ca)
        self.client_cert, self.client_key = pem(cli), _pem_key(cli_key)
        self.other_ca = pem(other_ca)
        self.files = {}
        for name, data in {
            "ca.pem": self.ca, "server.pem": pem(srv), "server.key": _pem_key(srv_key),
            "client.pem": self.client_cert, "client.key": self.client_key,
        }.items():  # fmt: skip
            (d / name).write_bytes(data)
            self.files[name] = str(d / name)


TOKENS = {name: secrets.token_hex(32) for name in ("producer", "worker", "ops")}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_broker(db_env, addr, pki, tmp_path_factory):
    auth = tmp_path_factory.mktemp("auth") / "tokens.json"
    grants = {
        "producer": [{"queues": "tls-*", "actions": ["enqueue"]}],
        "worker": [{"queues": "tls-*", "actions": ["consume"]}],
        "ops": [{"queues": "*", "actions": ["admin", "enqueue", "consume"]}],
    }
    auth.write_text(json.dumps({"tokens": [
        {"name": n, "sha256": hashlib.sha256(t.encode()).hexdigest(), "grants": grants[n]}
        for n, t in TOKENS.items()
    ]}))  # fmt: skip
    f = pki.files
    broker = Broker(
        db_env,
        ["--tls-cert", f["server.pem"], "--tls-key", f["server.key"],
         "--tls-client-ca", f["ca.pem"], "--auth-file", str(auth)],
        health_creds=grpc.ssl_channel_credentials(pki.ca, pki.client_key, pki.client_cert),
    )  # fmt: skip
    broker.start()
    yield broker
    broker.stop()


def mtls(pki, **kw):
    return TLS(ca=pki.files["ca.pem"], cert=pki.files["client.pem"], key=pki.files["client.key"], **kw)


def test_tls_and_tokens_on_the_sync_client_and_admin(tls_broker, pki):
    q = queue_name("tls")
    # Files or PEM bytes, either works.
    tls_bytes = TLS(ca=pki.ca, cert=pki.client_cert, key=pki.client_key)
    with Client(tls_broker.addr, tls=tls_bytes, token=TOKENS["producer"]) as producer:
        r = producer.enqueue(q, b"secret")
        with pytest.raises(RpcError) as e:  # enqueue only
            producer.subscribe(q).__iter__().__next__()
        assert e.value.code_name == "PERMISSION_DENIED" and "producer" in e.value.details()
        with pytest.raises(RpcError) as e:
            producer.enqueue("other-queue", b"x")
        assert e.value.code_name == "PERMISSION_DENIED"
    with Client(tls_broker.addr, tls=mtls(pki)) as anonymous:
        with pytest.raises(RpcError) as e:
            anonymous.enqueue(q, b"x")
        assert e.value.code_name == "UNAUTHENTICATED"
    with AdminClient(f"https://{tls_broker.addr}", tls=mtls(pki), token=TOKENS["ops"]) as admin:
        assert admin.get_job(r.job_id).payload == b"secret"
    with AdminClient(tls_broker.addr, tls=mtls(pki), token=TOKENS["worker"]) as not_admin:
        with pytest.raises(RpcError) as e:
            not_admin.get_queue(q)
        assert e.value.code_name == "PERMISSION_DENIED"


def test_tls_and_tokens_on_the_async_client_and_worker(tls_broker, pki):
    async def body():
        q = queue_name("tls")
        async with AsyncClient(tls_broker.addr, tls=mtls(pki, server_name="localhost"), token=TOKENS["producer"]) as c:
            await c.enqueue(q, b"over tls")
        got: asyncio.Queue = asyncio.Queue()
        w = Worker(tls_broker.addr, tls=mtls(pki), token=TOKENS["worker"], lease=5)

        @w.handler(q)
        async def handle(job: Job) -> None:
            await got.put(job)

        task = asyncio.ensure_future(w.run_async(handle_signals=False))
        assert (await asyncio.wait_for(got.get(), 10)).payload == b"over tls"
        w.stop()
        await task
        assert w.stats.acked == 1
        async with AsyncAdminClient(tls_broker.addr, tls=mtls(pki), token=TOKENS["ops"]) as admin:
            info = await admin.get_queue(q)
            assert (info.stats.available, info.stats.leased) == (0, 0)

    run(body())


def test_a_worker_without_a_valid_token_fails_fast(tls_broker, pki):
    w = Worker(tls_broker.addr, tls=mtls(pki), token="not-a-known-token")
    w.add_handler(queue_name("tls"), lambda job: None)
    with pytest.raises(RpcError) as e:
        run(w.run_async(handle_signals=False))
    assert e.value.code_name == "UNAUTHENTICATED"


def test_mutual_tls_refuses_a_client_without_a_certificate(tls_broker, pki):
    with Client(tls_broker.addr, tls=TLS(ca=pki.ca), token=TOKENS["ops"], timeout=5) as c:
        with pytest.raises(RpcError) as e:
            c.enqueue(queue_name("tls"), b"x")
        assert e.value.code_name == "UNAVAILABLE"


def test_a_broker_certificate_from_another_ca_is_refused(tls_broker, pki):
    tls = TLS(ca=pki.other_ca, cert=pki.client_cert, key=pki.client_key)
    with Client(tls_broker.addr, tls=tls, token=TOKENS["ops"], timeout=5) as c:
        with pytest.raises(RpcError) as e:
            c.enqueue(queue_name("tls"), b"x")
        assert e.value.code_name == "UNAVAILABLE"


def test_an_unreadable_ca_file_names_the_option(tmp_path):
    with pytest.raises(ValueError, match="tls.ca"):
        Client("127.0.0.1:1", tls=TLS(ca=str(tmp_path / "missing.pem")))


def test_tls_token_example(tls_broker, pki):
    from test_examples import run_example

    d = os.path.dirname(pki.files["ca.pem"])
    out = run_example("tls_token.py", tls_broker.addr, queue_name("tls"), LEASEQ_CERTS=d, LEASEQ_TOKEN=TOKENS["ops"])
    assert out[0].startswith("enqueued ") and out[1] == "waiting 1"


# ---- the same address forms and settings as every leaseq client ----------


def test_https_without_a_ca_trusts_the_system_roots(tls_broker, pki, monkeypatch):
    cert_only = TLS(cert=pki.files["client.pem"], key=pki.files["client.key"])
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", pki.files["ca.pem"])
    with Client(f"https://{tls_broker.addr}", tls=cert_only, token=TOKENS["ops"], timeout=10) as c:
        c.enqueue(queue_name("tls"), b"system roots")
    other = os.path.join(os.path.dirname(pki.files["ca.pem"]), "other-ca.pem")
    with open(other, "wb") as f:
        f.write(pki.other_ca)
    monkeypatch.setenv("SSL_CERT_FILE", other)
    with Client(f"https://{tls_broker.addr}", tls=cert_only, token=TOKENS["ops"], timeout=5) as c:
        with pytest.raises(RpcError) as e:
            c.enqueue(queue_name("tls"), b"x")
        assert e.value.code_name == "UNAVAILABLE"


def test_the_environment_fills_what_is_not_given(tls_broker, pki, monkeypatch):
    # host:port: TLS because LEASEQ_TLS_CA names a CA.
    monkeypatch.setenv("LEASEQ_ADDR", tls_broker.addr)
    monkeypatch.setenv("LEASEQ_TLS_CA", pki.files["ca.pem"])
    monkeypatch.setenv("LEASEQ_CLIENT_CERT", pki.files["client.pem"])
    monkeypatch.setenv("LEASEQ_CLIENT_KEY", pki.files["client.key"])
    monkeypatch.setenv("LEASEQ_TOKEN", TOKENS["ops"])
    with Client(timeout=10) as c:
        job_id = c.enqueue(queue_name("tls"), b"from the environment").job_id
    with AdminClient() as admin:
        assert admin.get_job(job_id).payload == b"from the environment"
    # An explicit option wins over its variable.
    with Client(token="not-a-token-of-this-broker", timeout=10) as c:
        with pytest.raises(RpcError) as e:
            c.enqueue(queue_name("tls"), b"x")
        assert e.value.code_name == "UNAUTHENTICATED"
    # http:// is plaintext: TLS settings, given or from the environment, refuse it.
    with pytest.raises(ValueError, match="http://"):
        Client(f"http://{tls_broker.addr}")
    monkeypatch.delenv("LEASEQ_TLS_CA")
    monkeypatch.delenv("LEASEQ_CLIENT_CERT")
    monkeypatch.delenv("LEASEQ_CLIENT_KEY")
    with pytest.raises(ValueError, match="scheme"):
        Client(f"grpc://{tls_broker.addr}")
