// Package worker runs leaseq jobs in Go: a handler per queue, at most
// Concurrency jobs at once (the stream's credit), every settle sent on the
// job's Consume stream, leases extended while a handler runs, a stream that
// ends (a broker's drain) opened again with backoff, and a graceful stop.
//
//	conn, _ := grpc.Dial("127.0.0.1:50051", grpc.WithInsecure())
//	w := worker.New(conn, worker.Options{Concurrency: 8})
//	w.Handle("emails", func(ctx context.Context, job *leaseqv1.Job) error {
//		return send(ctx, job.Payload) // nil acks; an error nacks
//	})
//	err := w.Run(ctx) // until ctx is cancelled; then a graceful stop
//
// A handler's result settles its job: nil acks it; an error nacks it (the
// job comes back after the queue's backoff, or is dead-lettered after its
// last attempt); DeadLetter(err) dead-letters it at once; RetryAfter(d,
// err) retries it after d. A handler whose lease was lost (an extension
// refused: the job was released and will be delivered again) sees its
// context cancelled, and its result is not sent.
//
// Graceful stop: when Run's context is cancelled the worker takes no new
// job; the handlers running finish (their contexts are not cancelled) and
// their settles go out on the open stream; then the worker half-closes the
// stream, the broker settles what it was sent and releases the jobs it had
// delivered but the worker never started, and Run returns nil.
package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand"
	"os"
	"sort"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	leaseqv1 "github.com/leaseq/leaseq/clients/go/leaseq/v1"
)

// Handler does one job's work.
type Handler func(ctx context.Context, job *leaseqv1.Job) error

// Options of a Worker. Zero values take the defaults.
type Options struct {
	// Jobs run at once: the stream's credit. Default 16, as the Python and
	// Node workers.
	Concurrency int
	// Lease of each delivery, extended every half lease while its handler
	// runs. Default: the queue's (30 s unless changed).
	Lease time.Duration
	// The consumer name admin views show. Default: the host name.
	Consumer string
	// Where the worker reports what it cannot return (a settle the broker
	// refused, a stream opened again). Default: log.Printf.
	Logf func(format string, args ...interface{})
}

// Worker runs handlers for the jobs of their queues.
type Worker struct {
	client   leaseqv1.QueueServiceClient
	opts     Options
	handlers map[string]Handler
}

// New makes a Worker calling the broker over conn.
func New(conn grpc.ClientConnInterface, opts Options) *Worker {
	if opts.Concurrency <= 0 {
		opts.Concurrency = 16
	}
	if opts.Consumer == "" {
		opts.Consumer, _ = os.Hostname()
	}
	if opts.Logf == nil {
		opts.Logf = log.Printf
	}
	return &Worker{client: leaseqv1.NewQueueServiceClient(conn), opts: opts, handlers: map[string]Handler{}}
}

// Handle sets the handler of queue's jobs (before Run).
func (w *Worker) Handle(queue string, h Handler) *Worker {
	w.handlers[queue] = h
	return w
}

type outcome struct {
	err        error
	dead       bool
	retryAfter *time.Duration
}

func (o *outcome) Error() string { return o.err.Error() }
func (o *outcome) Unwrap() error { return o.err }

// DeadLetter makes a handler's error dead-letter its job at once instead of
// retrying it.
func DeadLetter(err error) error { return &outcome{err: err, dead: true} }

// RetryAfter makes a handler's error retry its job after d (instead of the
// queue's backoff).
func RetryAfter(d time.Duration, err error) error { return &outcome{err: err, retryAfter: &d} }

// fatal reports the stream errors that opening it again cannot fix.
func fatal(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.NotFound, codes.Unimplemented:
		return true
	}
	return false
}

// Run consumes until ctx is cancelled, then stops gracefully and returns
// nil; or returns the error of a stream the broker refused for good (bad
// queue names, a token without the grant, ...).
func (w *Worker) Run(ctx context.Context) error {
	if len(w.handlers) == 0 {
		return errors.New("worker: no handler: call Handle first")
	}
	backoff := 100 * time.Millisecond
	for {
		started := time.Now()
		err := w.stream(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if fatal(err) {
			return err
		}
		if time.Since(started) > 10*time.Second {
			backoff = 100 * time.Millisecond
		}
		// The stream ended (a broker draining: UNAVAILABLE) or failed: open
		// it again after a backoff with jitter.
		wait := time.Duration(float64(backoff) * (0.5 + rand.Float64()/2))
		w.opts.Logf("leaseq worker: stream ended (%v); opening it again in %v", err, wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil
		}
		if backoff *= 2; backoff > 10*time.Second {
			backoff = 10 * time.Second
		}
	}
}

// running is a job whose handler runs.
type running struct {
	token  string
	cancel context.CancelFunc
}

// stream holds one Consume stream until it ends or ctx is done (then a
// graceful stop).
func (w *Worker) stream(ctx context.Context) error {
	queues := make([]string, 0, len(w.handlers))
	for q := range w.handlers {
		queues = append(queues, q)
	}
	sort.Strings(queues)
	sub := &leaseqv1.SubscribeRequest{
		Queues:      queues,
		Consumer:    w.opts.Consumer,
		MaxInFlight: uint32(w.opts.Concurrency),
	}
	if w.opts.Lease > 0 {
		sub.Lease = durationpb.New(w.opts.Lease)
	}
	// The stream's own context: cancelled only when this function returns
	// (never by ctx: a graceful stop half-closes the stream instead).
	streamCtx, cancelStream := context.WithCancel(context.Background())
	defer cancelStream()
	st, err := w.client.Consume(streamCtx)
	if err != nil {
		return err
	}
	if err := st.Send(&leaseqv1.ConsumeRequest{Subscribe: sub}); err != nil {
		_, err = st.Recv() // the status says why
		return err
	}

	// One goroutine sends (a gRPC stream takes one sender at a time): the
	// handlers' settles and extensions, until out is closed.
	out := make(chan *leaseqv1.ConsumeRequest, w.opts.Concurrency)
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for req := range out {
			if st.Send(req) != nil {
				// The stream is over; Recv reports why. Drain so no
				// handler blocks.
				for range out {
				}
				return
			}
		}
		_ = st.CloseSend() // the graceful stop's half-close
	}()

	// One goroutine receives.
	type received struct {
		msg *leaseqv1.ConsumeResponse
		err error
	}
	in := make(chan received)
	go func() {
		for {
			msg, err := st.Recv()
			select {
			case in <- received{msg, err}:
			case <-streamCtx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()

	var (
		mu       sync.Mutex
		jobs     = map[string]running{} // by job id
		handlers sync.WaitGroup
	)
	lost := func(id, token string) {
		mu.Lock()
		defer mu.Unlock()
		if r, ok := jobs[id]; ok && r.token == token {
			r.cancel()
		}
	}
	stopping := ctx.Done()
	var done chan struct{} // closed when the handlers of a stop are done
	for {
		select {
		case <-stopping:
			// Graceful stop: no new job; the running ones finish and
			// settle; then out is closed, which half-closes the stream.
			stopping = nil
			done = make(chan struct{})
			go func() {
				handlers.Wait()
				close(out)
				close(done)
			}()
		case r := <-in:
			if r.err != nil {
				// Over: the broker released every job not yet settled.
				// Handlers still running lose their leases.
				mu.Lock()
				for _, j := range jobs {
					j.cancel()
				}
				mu.Unlock()
				if done == nil {
					handlers.Wait()
					close(out)
				} else {
					<-done
				}
				<-sent
				if r.err == io.EOF {
					return nil
				}
				return r.err
			}
			switch k := r.msg.Kind.(type) {
			case *leaseqv1.ConsumeResponse_Delivery:
				if done != nil {
					continue // stopping: the broker releases it at the close
				}
				d := k.Delivery
				h := w.handlers[d.Job.GetQueue()]
				jobCtx, cancel := context.WithCancel(context.Background())
				mu.Lock()
				jobs[d.Job.GetId()] = running{token: d.LeaseToken, cancel: cancel}
				mu.Unlock()
				handlers.Add(1)
				go func() {
					defer handlers.Done()
					defer func() {
						mu.Lock()
						if r, ok := jobs[d.Job.GetId()]; ok && r.token == d.LeaseToken {
							delete(jobs, d.Job.GetId())
						}
						mu.Unlock()
						cancel()
					}()
					if req := w.run(jobCtx, h, d, out); req != nil {
						out <- req
					}
				}()
			case *leaseqv1.ConsumeResponse_Settled:
				for _, res := range k.Settled.Results {
					if res.Code == 0 {
						continue
					}
					if res.Op == leaseqv1.SettleOp_SETTLE_OP_EXTEND {
						lost(res.JobId, res.LeaseToken)
					}
					w.opts.Logf("leaseq worker: %v of job %s refused: %v: %s",
						res.Op, res.JobId, codes.Code(res.Code), res.Message)
				}
			}
		}
	}
}

// run runs the handler of one delivery, extending its lease every half
// lease, and returns the settle to send (nil when the lease was lost).
func (w *Worker) run(ctx context.Context, h Handler, d *leaseqv1.Delivery, out chan<- *leaseqv1.ConsumeRequest) *leaseqv1.ConsumeRequest {
	job := d.Job
	result := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				result <- fmt.Errorf("handler panicked: %v", p)
			}
		}()
		result <- h(ctx, job)
	}()
	lease := w.opts.Lease
	if lease <= 0 && d.LeaseExpiresAt != nil {
		lease = time.Until(d.LeaseExpiresAt.AsTime())
	}
	if lease < 2*time.Second {
		lease = 2 * time.Second
	}
	tick := time.NewTicker(lease / 2)
	defer tick.Stop()
	for {
		select {
		case err := <-result:
			if ctx.Err() != nil {
				return nil // the lease was lost: the job comes again
			}
			if err == nil {
				return &leaseqv1.ConsumeRequest{Acks: []*leaseqv1.AckRequest{{JobId: job.Id, LeaseToken: d.LeaseToken}}}
			}
			nack := &leaseqv1.NackRequest{JobId: job.Id, LeaseToken: d.LeaseToken, Error: err.Error()}
			var o *outcome
			if errors.As(err, &o) {
				nack.DeadLetter = o.dead
				if o.retryAfter != nil {
					nack.RetryAfter = durationpb.New(*o.retryAfter)
				}
			}
			return &leaseqv1.ConsumeRequest{Nacks: []*leaseqv1.NackRequest{nack}}
		case <-tick.C:
			out <- &leaseqv1.ConsumeRequest{Extends: []*leaseqv1.ExtendLeaseRequest{{
				JobId: job.Id, LeaseToken: d.LeaseToken, Lease: durationpb.New(lease),
			}}}
		}
	}
}
