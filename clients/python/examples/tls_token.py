"""TLS, mutual TLS and a bearer token: options of every client."""

import os

from leaseq import TLS, AdminClient, Client, Worker

addr = os.environ.get("LEASEQ_ADDR", "broker.internal:50051")
certs = os.environ.get("LEASEQ_CERTS", "/etc/leaseq")
token = os.environ.get("LEASEQ_TOKEN", "")
queue = os.environ.get("LEASEQ_QUEUE", "emails")

tls = TLS(
    ca=f"{certs}/ca.pem",  # the CA that signed the broker's certificate
    cert=f"{certs}/client.pem",  # client certificate and key: for --tls-client-ca (mTLS)
    key=f"{certs}/client.key",
)
with Client(addr, tls=tls, token=token) as client:
    print("enqueued", client.enqueue(queue, b"over TLS").job_id)

worker = Worker(addr, tls=tls, token=token)
with AdminClient(addr, tls=tls, token=token) as admin:
    print("waiting", admin.get_queue(queue).stats.available)
