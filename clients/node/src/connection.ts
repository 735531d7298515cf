// One channel to a broker: address, TLS, bearer token.
//
// Every leaseq client (this package, the Rust crate and CLI, Python, Go)
// takes the same addresses and settings:
// - `host:port`: plaintext, or TLS when TLS settings are given;
//   `http://host:port`: plaintext; `https://host:port`: TLS.
// - TLS verifies the broker against the CA given, else the system's roots
//   (`systemRoots()`: SSL_CERT_FILE, else the operating system's bundle).
// - What the caller leaves out comes from the environment: LEASEQ_ADDR
//   (default 127.0.0.1:50051), LEASEQ_TOKEN, LEASEQ_TLS_CA,
//   LEASEQ_CLIENT_CERT, LEASEQ_CLIENT_KEY.

import * as fs from 'node:fs';
import * as tls from 'node:tls';
import * as grpc from '@grpc/grpc-js';

/** The broker's address when neither the caller nor LEASEQ_ADDR gives one. */
export const DEFAULT_ADDR = '127.0.0.1:50051';

function env(name: string): string | undefined {
  const v = process.env[name];
  return v ? v : undefined;
}

/** Where operating systems keep their bundle of trusted roots. */
const SYSTEM_BUNDLES = [
  '/etc/ssl/certs/ca-certificates.crt', // Debian, Ubuntu, Alpine, Arch
  '/etc/pki/tls/certs/ca-bundle.crt', // Fedora, RHEL
  '/etc/ssl/ca-bundle.pem', // openSUSE
  '/etc/ssl/cert.pem', // macOS, BSDs
];

/**
 * The system's trusted roots (PEM), as OpenSSL finds them: the file
 * SSL_CERT_FILE names, else the operating system's store (Node's
 * `tls.getCACertificates('system')` where it exists, else the system's
 * bundle file). Null where there is none: grpc-js then uses the roots Node
 * ships with.
 */
export function systemRoots(): Buffer | null {
  const file = env('SSL_CERT_FILE');
  if (file && fs.existsSync(file)) return fs.readFileSync(file);
  const getCA = (tls as unknown as { getCACertificates?: (type: string) => string[] }).getCACertificates;
  if (typeof getCA === 'function') {
    const certs = getCA('system');
    if (certs.length) return Buffer.from(certs.join('\n'));
  }
  for (const bundle of SYSTEM_BUNDLES) {
    if (fs.existsSync(bundle)) return fs.readFileSync(bundle);
  }
  return null;
}

/**
 * TLS settings. PEM contents (`ca`, `cert`, `key`) or file paths (`caFile`,
 * `certFile`, `keyFile`). Without a CA the system's roots are used
 * (`systemRoots()`). `cert` and `key` together present a client certificate
 * (for a broker started with `--tls-client-ca`).
 */
export interface TlsOptions {
  ca?: string | Buffer;
  caFile?: string;
  cert?: string | Buffer;
  certFile?: string;
  key?: string | Buffer;
  keyFile?: string;
  /** Check the broker's certificate against this name instead of the address's host. */
  serverName?: string;
}

/** How to reach a broker; accepted by Client, AdminClient. */
export interface ConnectionOptions {
  /**
   * TLS: true (system roots), or TlsOptions. Default: on for an `https://`
   * address, or when LEASEQ_TLS_CA / LEASEQ_CLIENT_CERT name files (then
   * used); off otherwise (the broker's default is plaintext).
   */
  tls?: boolean | TlsOptions;
  /**
   * Bearer token sent as `authorization: Bearer <token>` on every call
   * (see the broker's --auth-file), or a function returning the current one.
   * Default: LEASEQ_TOKEN, if set.
   */
  token?: string | (() => string);
  /** Channel credentials built by hand; overrides `tls`. */
  credentials?: grpc.ChannelCredentials;
  /** grpc-js channel options (`grpc.keepalive_time_ms`, ...). */
  channelOptions?: grpc.ChannelOptions;
  /** grpc-js client interceptors, run on every call (after the token's). */
  interceptors?: grpc.Interceptor[];
}

// gRPC's own reconnect backoff grows to 120 s, and while a channel waits in it
// every call fails at once: a worker would sit idle for minutes after a broker
// restart. Capped at the Worker's default backoff maximum instead.
const CHANNEL_DEFAULTS: grpc.ChannelOptions = { 'grpc.max_reconnect_backoff_ms': 10000 };

function pem(inline: string | Buffer | undefined, file: string | undefined, what: string): Buffer | null {
  if (inline != null && file != null) throw new TypeError(`tls: give ${what} or ${what}File, not both`);
  if (inline != null) return Buffer.isBuffer(inline) ? inline : Buffer.from(inline);
  if (file != null) return fs.readFileSync(file);
  return null;
}

/** @internal A channel and the interceptors every stub on it uses. */
export class Connection {
  readonly target: string;
  readonly channel: grpc.Channel;
  readonly interceptors: grpc.Interceptor[];
  #closed = false;

  constructor(address?: string | null, opts: ConnectionOptions = {}) {
    // What the caller leaves out, the environment gives.
    if (address == null) address = env('LEASEQ_ADDR') ?? DEFAULT_ADDR;
    if (typeof address !== 'string' || address.trim() === '') throw new TypeError('address: expected "host:port"');
    address = address.trim();
    let tls = opts.tls;
    if (tls === undefined && !opts.credentials) {
      const [caFile, certFile, keyFile] = [env('LEASEQ_TLS_CA'), env('LEASEQ_CLIENT_CERT'), env('LEASEQ_CLIENT_KEY')];
      if (caFile || certFile || keyFile) tls = { caFile, certFile, keyFile };
    }
    if (opts.token === undefined && env('LEASEQ_TOKEN')) opts = { ...opts, token: env('LEASEQ_TOKEN') };
    let target = address;
    const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(address);
    if (scheme) {
      const name = scheme[1].toLowerCase();
      if (name !== 'http' && name !== 'https') {
        throw new TypeError(`address: unknown scheme ${name}:// (use host:port, http:// or https://)`);
      }
      if (name === 'http' && tls) throw new TypeError('address: http:// is plaintext, but TLS settings were given');
      target = address.slice(scheme[0].length).replace(/\/+$/, '');
      if (name === 'https' && !tls) tls = true;
    }
    this.target = target;
    const channelOptions: grpc.ChannelOptions = { ...CHANNEL_DEFAULTS, ...opts.channelOptions };
    let credentials = opts.credentials;
    if (!credentials) {
      if (tls) {
        const t: TlsOptions = tls === true ? {} : tls;
        const cert = pem(t.cert, t.certFile, 'cert');
        const key = pem(t.key, t.keyFile, 'key');
        if ((cert === null) !== (key === null)) throw new TypeError('tls: a client certificate needs both cert and key');
        credentials = grpc.credentials.createSsl(pem(t.ca, t.caFile, 'ca') ?? systemRoots(), key, cert);
        if (t.serverName) {
          channelOptions['grpc.ssl_target_name_override'] = t.serverName;
          channelOptions['grpc.default_authority'] = t.serverName;
        }
      } else {
        credentials = grpc.credentials.createInsecure();
      }
    }
    this.channel = new grpc.Channel(target, credentials, channelOptions);
    // The token as call metadata through an interceptor rather than call
    // credentials: grpc-js refuses call credentials on a plaintext channel,
    // and a broker behind a TLS-terminating proxy is plaintext to us.
    this.interceptors = [];
    if (opts.token != null) {
      const token = opts.token;
      if (typeof token !== 'function' && (typeof token !== 'string' || token === '')) {
        throw new TypeError('token: expected a non-empty string or a function returning one');
      }
      this.interceptors.push((options, nextCall) =>
        new grpc.InterceptingCall(nextCall(options), {
          start(metadata, listener, next) {
            metadata.set('authorization', `Bearer ${typeof token === 'function' ? token() : token}`);
            next(metadata, listener);
          },
        }),
      );
    }
    this.interceptors.push(...(opts.interceptors ?? []));
  }

  /** Stub options sharing this channel. */
  stubOptions(): grpc.ClientOptions {
    return { channelOverride: this.channel, interceptors: this.interceptors };
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.channel.close();
  }
}
