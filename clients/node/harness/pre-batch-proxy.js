'use strict';
// A pass-through gRPC proxy in front of a real broker that makes it look
// like a broker from before batched deliveries (issue 36): the opening
// SubscribeRequest loses its `accept` (so the broker sends one delivery a
// message) and the stream's first heartbeat loses its `features` (so the
// client learns nothing of what the broker understands). Everything else is
// forwarded byte for byte. It lets the SDK's old-broker path be tested
// against the current broker.

const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { REPO } = require('./helpers');

const UNARY = ['Enqueue', 'EnqueueBatch', 'Ack', 'AckBatch', 'Nack', 'ExtendLease'];
const id = (b) => b;
const service = protoLoader.loadSync('leaseq/v1/queue.proto', {
  includeDirs: [path.join(REPO, 'proto')],
  enums: String,
  oneofs: true,
})['leaseq.v1.QueueService'];

function method(name, requestStream, responseStream) {
  return {
    path: `/leaseq.v1.QueueService/${name}`,
    requestStream,
    responseStream,
    requestSerialize: id,
    requestDeserialize: id,
    responseSerialize: id,
    responseDeserialize: id,
  };
}

// The first response of a stream without the heartbeat's features.
function stripFeatures(name, bytes) {
  const msg = service[name].responseDeserialize(bytes);
  if (msg.heartbeat) delete msg.heartbeat.features;
  return service[name].responseSerialize(msg);
}

// Upstream's responses to the client: the first stripped, then as they are.
function pipeDown(name, up, call) {
  let first = true;
  let failed = false;
  up.on('data', (bytes) => {
    call.write(first ? stripFeatures(name, bytes) : bytes);
    first = false;
  });
  up.on('error', (err) => {
    failed = true;
    if (!call.cancelled) call.emit('error', { code: err.code, details: err.details });
  });
  up.on('end', () => failed || call.end());
  call.on('cancelled', () => up.cancel());
}

/** Starts the proxy on 127.0.0.1; resolves to { addr, close() }. */
async function startPreBatchProxy(target) {
  const upstream = new grpc.Client(target, grpc.credentials.createInsecure());
  const server = new grpc.Server();
  const definition = {};
  const impl = {};
  for (const name of UNARY) {
    definition[name] = method(name, false, false);
    impl[name] = (call, callback) => {
      upstream.makeUnaryRequest(definition[name].path, id, id, call.request, call.metadata, (err, resp) => callback(err, resp));
    };
  }
  definition.Subscribe = method('Subscribe', false, true);
  impl.Subscribe = (call) => {
    const req = service.Subscribe.requestDeserialize(call.request);
    delete req.accept;
    const up = upstream.makeServerStreamRequest(definition.Subscribe.path, id, id, service.Subscribe.requestSerialize(req), call.metadata);
    pipeDown('Subscribe', up, call);
  };
  definition.Consume = method('Consume', true, true);
  impl.Consume = (call) => {
    const up = upstream.makeBidiStreamRequest(definition.Consume.path, id, id, call.metadata);
    let first = true;
    call.on('data', (bytes) => {
      if (first) {
        const req = service.Consume.requestDeserialize(bytes);
        if (req.subscribe) delete req.subscribe.accept;
        bytes = service.Consume.requestSerialize(req);
        first = false;
      }
      up.write(bytes);
    });
    call.on('end', () => up.end());
    pipeDown('Consume', up, call);
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

module.exports = { startPreBatchProxy };
