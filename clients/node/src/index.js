'use strict';
// Node.js client for leaseq, a durable gRPC job queue on PostgreSQL.
//   Client: Enqueue, EnqueueBatch, Ack, Nack, ExtendLease (Promises).
//   Worker: Subscribe with reconnect, bounded concurrency, automatic lease
//           extension, Ack/Nack from the handler's outcome, graceful stop.
const { status } = require('@grpc/grpc-js');
const { Client, duration } = require('./client');
const { Worker, Backoff, FATAL_CODES } = require('./worker');

module.exports = { Client, Worker, Backoff, FATAL_CODES, duration, status };
