'use strict';
// A pass-through gRPC proxy in front of a real broker that knows only the
// QueueService methods from before Consume (a gateway or broker of an older
// release): every call it knows is forwarded byte for byte, and Consume is
// answered UNIMPLEMENTED by grpc-js itself, as an older broker does. It lets
// the fallback (Subscribe + AckBatch) be tested against a broker that
// serves Consume.

const grpc = require('@grpc/grpc-js');

const UNARY = ['Enqueue', 'EnqueueBatch', 'Ack', 'AckBatch', 'Nack', 'ExtendLease'];
const id = (b) => b;

function method(name, responseStream) {
  return {
    path: `/leaseq.v1.QueueService/${name}`,
    requestStream: false,
    responseStream,
    requestSerialize: id,
    requestDeserialize: id,
    responseSerialize: id,
    responseDeserialize: id,
  };
}

/** Starts the proxy on 127.0.0.1; resolves to { addr, close() }. */
async function startOldApiProxy(target) {
  const upstream = new grpc.Client(target, grpc.credentials.createInsecure());
  const server = new grpc.Server();
  const definition = {};
  const impl = {};
  for (const name of UNARY) {
    definition[name] = method(name, false);
    impl[name] = (call, callback) => {
      upstream.makeUnaryRequest(definition[name].path, id, id, call.request, call.metadata, (err, resp) => callback(err, resp));
    };
  }
  definition.Subscribe = method('Subscribe', true);
  impl.Subscribe = (call) => {
    const up = upstream.makeServerStreamRequest(definition.Subscribe.path, id, id, call.request, call.metadata);
    let failed = false;
    up.on('data', (msg) => call.write(msg));
    up.on('error', (err) => {
      failed = true;
      if (!call.cancelled) call.emit('error', { code: err.code, details: err.details });
    });
    up.on('end', () => failed || call.end());
    call.on('cancelled', () => up.cancel());
  };
  server.addService(definition, impl);
  const port = await new Promise((resolve, reject) => {
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p)));
  });
  return {
    addr: `127.0.0.1:${port}`,
    close() {
      server.forceShutdown();
      upstream.close();
    },
  };
}

module.exports = { startOldApiProxy };
