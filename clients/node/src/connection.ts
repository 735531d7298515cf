// One channel to a broker: address, TLS, bearer token.

import * as fs from 'node:fs';
import * as grpc from '@grpc/grpc-js';

/**
 * TLS settings. PEM contents (`ca`, `cert`, `key`) or file paths (`caFile`,
 * `certFile`, `keyFile`). Without a CA the system's roots are used. `cert`
 * and `key` together present a client certificate (for a broker started
 * with `--tls-client-ca`).
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
   * address, off otherwise (the broker's default is plaintext).
   */
  tls?: boolean | TlsOptions;
  /**
   * Bearer token sent as `authorization: Bearer <token>` on every call
   * (see the broker's --auth-file), or a function returning the current one.
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

  constructor(address: string, opts: ConnectionOptions = {}) {
    if (typeof address !== 'string' || address === '') throw new TypeError('address: expected "host:port"');
    let target = address;
    let tls = opts.tls;
    const scheme = /^(https?):\/\//.exec(address);
    if (scheme) {
      target = address.slice(scheme[0].length).replace(/\/+$/, '');
      if (tls === undefined) tls = scheme[1] === 'https';
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
        credentials = grpc.credentials.createSsl(pem(t.ca, t.caFile, 'ca'), key, cert);
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
