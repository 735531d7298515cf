'use strict';
// A broker with TLS, mutual TLS and bearer tokens: certificates made with
// openssl in a temporary directory, tokens hashed by `leaseq hash-token`.

const { execFileSync } = require('node:child_process');
const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const { Broker } = require('./helpers');

function openssl(args, cwd) {
  execFileSync('openssl', args, { cwd, stdio: ['ignore', 'ignore', 'pipe'] });
}

/** A CA, a server certificate for 127.0.0.1 / localhost, a client certificate, and an unrelated CA. */
function makeCerts(dir) {
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  const ca = (name) => openssl(['req', '-x509', ...ec, '-keyout', `${name}.key`, '-out', `${name}.pem`, '-days', '2',
    '-subj', `/CN=leaseq test ${name}`], dir);
  ca('ca');
  ca('other-ca');
  const leaf = (name, ext) => {
    openssl(['req', ...ec, '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${name}`], dir);
    fs.writeFileSync(path.join(dir, `${name}.ext`), ext);
    openssl(['x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial',
      '-out', `${name}.pem`, '-days', '2', '-extfile', `${name}.ext`], dir);
    fs.chmodSync(path.join(dir, `${name}.key`), 0o600);
  };
  leaf('server', 'subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n');
  leaf('client', 'basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n');
  const f = (n) => path.join(dir, n);
  return {
    ca: f('ca.pem'), otherCa: f('other-ca.pem'),
    serverCert: f('server.pem'), serverKey: f('server.key'),
    clientCert: f('client.pem'), clientKey: f('client.key'),
  };
}

function hashToken(bin, token) {
  return execFileSync(bin, ['hash-token'], { input: token }).toString().trim();
}

/**
 * Starts `leaseq serve` with --tls-cert/--tls-key/--tls-client-ca and
 * --auth-file. Tokens: `ops` (admin, enqueue, consume on everything),
 * `producer` (enqueue on `tls*`), `worker` (consume on `tls*`).
 */
async function startSecureBroker() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'leaseq-js-tls-'));
  const certs = makeCerts(dir);
  const bin = process.env.LEASEQ_BIN || path.join(__dirname, '..', '..', '..', 'target', 'debug', 'leaseq');
  const tokens = {
    ops: crypto.randomBytes(32).toString('hex'),
    producer: crypto.randomBytes(32).toString('hex'),
    worker: crypto.randomBytes(32).toString('hex'),
  };
  const grants = {
    ops: [{ queues: '*', actions: ['admin', 'enqueue', 'consume'] }],
    producer: [{ queues: 'tls*', actions: ['enqueue'] }],
    worker: [{ queues: 'tls*', actions: ['consume'] }],
  };
  const authFile = path.join(dir, 'tokens.json');
  fs.writeFileSync(authFile, JSON.stringify({
    tokens: Object.entries(tokens).map(([name, t]) => ({ name, sha256: hashToken(bin, t), grants: grants[name] })),
  }));
  const read = (p) => fs.readFileSync(p);
  const broker = await Broker.start({
    args: ['--tls-cert', certs.serverCert, '--tls-key', certs.serverKey, '--tls-client-ca', certs.ca, '--auth-file', authFile],
    healthCredentials: grpc.credentials.createSsl(read(certs.ca), read(certs.clientKey), read(certs.clientCert)),
    healthOptions: { 'grpc.ssl_target_name_override': 'localhost', 'grpc.default_authority': 'localhost' },
  });
  return {
    broker,
    addr: broker.addr,
    certs,
    tokens,
    /** The Client options of a fully configured client (mTLS) with this token. */
    // serverName: the certificate's DNS name (an IP address is no TLS server
    // name, and Node warns about one).
    tls: { caFile: certs.ca, certFile: certs.clientCert, keyFile: certs.clientKey, serverName: 'localhost' },
    async stop() {
      await broker.stop();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

module.exports = { startSecureBroker, makeCerts };
