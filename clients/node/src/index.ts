// Node.js client for leaseq, a durable gRPC job queue on PostgreSQL.
//   Client:      Enqueue, EnqueueBatch, the settles, consume() (async iterator)
//   Worker:      handlers per queue, timeouts, outcomes, graceful stop
//   AdminClient: every AdminService call
//   testing:     a throwaway broker and drain(), for tests

export { status } from '@grpc/grpc-js';
export { AdminClient } from './admin';
export type {
  CatchUpPolicy, DeadLettersSelector, JobInfo, JobList, JobState, JobTemplate, KeyInfo, KeyList, KeyOrder, KeyOverride, OverlapPolicy, Page, QueueInfo, QueueSettings, QueueStats, QueueUpdate,
  ScheduleInfo, ScheduleSpec, ScheduleUpdate,
} from './admin';
export { Client } from './client';
export type { AckResult, ClientOptions, EnqueueJob, EnqueueOptions, EnqueueResult } from './client';
export { WaitResult } from './client';
export { DEFAULT_ADDR, systemRoots } from './connection';
export type { ConnectionOptions, TlsOptions } from './connection';
export { FATAL_CODES, JobStream } from './consumer';
export type { ConsumeOptions, JobCancelled, Logger, ProtocolOption, StreamOptions } from './consumer';
export { Ack, DeadLetter, JobCancelledError, JobFailedError, JobTimeoutError, LeaseLostError, LeaseqError, Retry } from './errors';
export { Job } from './job';
export type { Cancelled, Protocol } from './session';
export type { NackOptions } from './job';
export { duration } from './proto';
export { Backoff } from './rpc';
export { defineTask, JobHandle, Task } from './task';
export type { TaskHandler } from './task';
export { DEFAULT_CONCURRENCY, Worker } from './worker';
export type { Handler, HandlerContext, HandlerOptions, JobEvent, JobOutcome, Middleware, WorkerOptions, WorkerStats } from './worker';
export * as testing from './testing';
export type { DrainOptions, DrainTarget, StartBrokerOptions, TestBroker } from './testing';
