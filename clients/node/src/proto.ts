// The service definitions, loaded from the .proto files at runtime with
// @grpc/proto-loader: no code generation step and no protoc binary, and
// proto/ stays the one source of truth. A packed package carries proto/
// (copied by `npm pack`'s prepack); in the repository the build reads the
// repository's own proto/.

import * as fs from 'node:fs';
import * as path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

/** @internal */
export function protoDir(): string {
  // dist/cjs/proto.js -> <package>/proto, or <repo>/proto from clients/node.
  const packaged = path.join(__dirname, '..', '..', 'proto');
  if (fs.existsSync(path.join(packaged, 'leaseq', 'v1', 'queue.proto'))) return packaged;
  return path.join(__dirname, '..', '..', '..', '..', 'proto');
}

const definition = protoLoader.loadSync(['leaseq/v1/queue.proto', 'leaseq/v1/admin.proto'], {
  includeDirs: [protoDir()],
  keepCase: false, // camelCase fields: jobId, leaseToken, maxInFlight
  // int64 (Duration/Timestamp seconds, counts) as numbers: exact below
  // 2^53, which no second count or job count reaches. Strings (Long's
  // toString) cost 1-2.5 us more per delivery (two timestamps each):
  // docs/benchmarks/notebook.md, "SDK workers".
  longs: Number,
  enums: String,
  defaults: true,
  oneofs: true, // response `kind` is 'delivery', 'heartbeat' or 'settled'
});
const pkg = grpc.loadPackageDefinition(definition) as unknown as {
  leaseq: { v1: { QueueService: grpc.ServiceClientConstructor; AdminService: grpc.ServiceClientConstructor } };
};

/** @internal */
export const QueueService = pkg.leaseq.v1.QueueService;
/** @internal */
export const AdminService = pkg.leaseq.v1.AdminService;

/** A protobuf Duration / Timestamp (seconds may be a string when it comes from elsewhere). */
export interface PbTime {
  seconds: string | number;
  nanos: number;
}

/** A protobuf Duration from milliseconds. */
export function duration(ms: number): PbTime {
  if (!Number.isFinite(ms) || ms < 0) throw new RangeError(`duration: ${ms} is not a length of time in ms`);
  const seconds = Math.floor(ms / 1000);
  return { seconds, nanos: Math.round((ms - seconds * 1000) * 1e6) };
}

/** @internal */
export function timestamp(date: Date): PbTime {
  const ms = date.getTime();
  const seconds = Math.floor(ms / 1000);
  return { seconds, nanos: (ms - seconds * 1000) * 1e6 };
}

/** @internal */
export function toDate(ts: PbTime | null | undefined): Date | null {
  return ts ? new Date(Number(ts.seconds) * 1000 + Math.floor(ts.nanos / 1e6)) : null;
}

/** @internal */
export function toMs(d: PbTime | null | undefined): number | null {
  return d ? Number(d.seconds) * 1000 + d.nanos / 1e6 : null;
}
