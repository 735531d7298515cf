// A leaseq producer and worker in Go, on nothing but the generated package
// (./generate.sh) and grpc-go: the worker loop docs/clients.md describes.
//
//	example produce QUEUE PAYLOAD...      enqueue one job per PAYLOAD
//	example work QUEUE [-concurrency N] [-lease 30s] [-count N]
//	example tenants QUEUE                 per-key limits and fair shares
//
// The worker prints "handled JOB_ID PAYLOAD attempt=N" per job it acks.
// Its handler (handle below) stands for real work: a payload "fail:MSG"
// fails its first attempt (the job comes back), "dead:REASON" is given up at
// once (a dead letter), anything else succeeds. It stops on SIGTERM/SIGINT,
// or after -count jobs are settled.
//
// Environment, as every leaseq client reads it: LEASEQ_ADDR (host:port,
// http:// or https://; default 127.0.0.1:50051), LEASEQ_TOKEN (a bearer
// token), LEASEQ_TLS_CA (a PEM file: TLS, the broker verified against it
// instead of the system's roots), LEASEQ_CLIENT_CERT and LEASEQ_CLIENT_KEY
// (mutual TLS). See dial.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log"
	"math/rand"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	leaseqv1 "github.com/leaseq/leaseq/clients/go/leaseq/v1"
)

func main() {
	log.SetFlags(0)
	if len(os.Args) < 3 {
		log.Fatal("usage: example produce QUEUE PAYLOAD... | example work QUEUE [flags] | example tenants QUEUE")
	}
	conn, err := dial()
	if err != nil {
		log.Fatalf("connect: %v", err)
	}
	defer conn.Close()
	client := leaseqv1.NewQueueServiceClient(conn)
	switch os.Args[1] {
	case "produce":
		produce(client, os.Args[2], os.Args[3:])
	case "work":
		work(client, os.Args[2], os.Args[3:])
	case "tenants":
		tenants(leaseqv1.NewAdminServiceClient(conn), os.Args[2])
	default:
		log.Fatalf("unknown command %q", os.Args[1])
	}
}

// dial connects as every leaseq client does. LEASEQ_ADDR (default
// 127.0.0.1:50051) is host:port (plaintext, or TLS when a CA or a client
// certificate is set), http://host:port (plaintext) or https://host:port
// (TLS). TLS verifies the broker against LEASEQ_TLS_CA, else the system's
// roots (crypto/x509's: SSL_CERT_FILE / SSL_CERT_DIR, else the system's
// bundle); LEASEQ_CLIENT_CERT and LEASEQ_CLIENT_KEY present a client
// certificate (mutual TLS). LEASEQ_TOKEN, when set, is sent as
// "authorization: Bearer ..." on every call.
func dial() (*grpc.ClientConn, error) {
	addr := strings.TrimSpace(os.Getenv("LEASEQ_ADDR"))
	if addr == "" {
		addr = "127.0.0.1:50051"
	}
	ca, cert, key := os.Getenv("LEASEQ_TLS_CA"), os.Getenv("LEASEQ_CLIENT_CERT"), os.Getenv("LEASEQ_CLIENT_KEY")
	useTLS := ca != "" || cert != "" || key != ""
	switch {
	case strings.HasPrefix(addr, "https://"):
		addr, useTLS = strings.TrimPrefix(addr, "https://"), true
	case strings.HasPrefix(addr, "http://"):
		if useTLS {
			return nil, fmt.Errorf("LEASEQ_ADDR %q: http:// is plaintext, but TLS files were given", addr)
		}
		addr = strings.TrimPrefix(addr, "http://")
	case strings.Contains(addr, "://"):
		return nil, fmt.Errorf("LEASEQ_ADDR %q: the scheme must be http:// or https:// (or none: host:port)", addr)
	}
	addr = strings.TrimSuffix(addr, "/")
	opts := []grpc.DialOption{}
	if useTLS {
		config := &tls.Config{} // RootCAs nil: the system's roots
		if ca != "" {
			pem, err := os.ReadFile(ca)
			if err != nil {
				return nil, fmt.Errorf("LEASEQ_TLS_CA: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("LEASEQ_TLS_CA: no certificate in %s", ca)
			}
			config.RootCAs = pool
		}
		if cert != "" || key != "" {
			pair, err := tls.LoadX509KeyPair(cert, key)
			if err != nil {
				return nil, fmt.Errorf("LEASEQ_CLIENT_CERT / LEASEQ_CLIENT_KEY: %w", err)
			}
			config.Certificates = []tls.Certificate{pair}
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(config)))
	} else {
		opts = append(opts, grpc.WithInsecure())
	}
	if token := os.Getenv("LEASEQ_TOKEN"); token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(token)))
	}
	return grpc.Dial(addr, opts...)
}

type bearer string

func (t bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(t)}, nil
}

// RequireTransportSecurity: false lets the example send a token over
// plaintext to a local broker; a real deployment uses TLS.
func (bearer) RequireTransportSecurity() bool { return false }

func produce(client leaseqv1.QueueServiceClient, queue string, payloads []string) {
	for _, p := range payloads {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := client.Enqueue(ctx, &leaseqv1.EnqueueRequest{
			Queue:   queue,
			Payload: []byte(p),
			Headers: map[string]string{"content-type": "text/plain"},
		})
		cancel()
		if err != nil {
			log.Fatalf("enqueue: %v", err)
		}
		fmt.Printf("enqueued %s %s\n", resp.JobId, p)
	}
}

// tenants makes QUEUE a queue shared by tenants, a job's key naming its
// tenant (EnqueueRequest.Key): each lease round serves the tenants in turn,
// at most 2 jobs of a tenant run at once, and "enterprise-7" gets 10 at
// once and 5 jobs a turn. It prints the settings the broker reports.
func tenants(admin leaseqv1.AdminServiceClient, queue string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fair, perKey := true, int32(2)
	info, err := admin.UpdateQueue(ctx, &leaseqv1.UpdateQueueRequest{
		Queue:          queue,
		Create:         true,
		FairByKey:      &fair,
		KeyConcurrency: &perKey,
		// Replaces the whole list; an empty KeyOverrides{} clears it.
		KeyOverrides: &leaseqv1.KeyOverrides{Overrides: []*leaseqv1.KeyOverride{
			{Key: "enterprise-7", Concurrency: 10, Weight: 5},
		}},
	})
	if err != nil {
		log.Fatalf("update queue: %v", err) // INVALID_ARGUMENT names the field
	}
	s := info.Settings
	fmt.Printf("%s fair_by_key=%t key_concurrency=%d", info.Name, s.FairByKey, s.KeyConcurrency)
	for _, o := range s.KeyOverrides {
		fmt.Printf(" %s:concurrency=%d,weight=%d", o.Key, o.Concurrency, o.Weight)
	}
	fmt.Println()
}

// errDeadLetter marks a failure that retrying cannot fix.
var errDeadLetter = errors.New("dead letter")

// handle is the job's work.
func handle(ctx context.Context, job *leaseqv1.Job) error {
	p := string(job.Payload)
	switch {
	case strings.HasPrefix(p, "dead:"):
		return fmt.Errorf("%w: %s", errDeadLetter, strings.TrimPrefix(p, "dead:"))
	case strings.HasPrefix(p, "fail:") && job.Attempt == 1:
		return errors.New(strings.TrimPrefix(p, "fail:"))
	}
	select {
	case <-time.After(10 * time.Millisecond): // the work
		return nil
	case <-ctx.Done(): // the lease was lost, or the worker stops
		return ctx.Err()
	}
}

func work(client leaseqv1.QueueServiceClient, queue string, args []string) {
	fs := flag.NewFlagSet("work", flag.ExitOnError)
	// 16, as in every leaseq SDK: a bare Subscribe's default credit.
	concurrency := fs.Int("concurrency", 16, "jobs run at once (the stream's credit)")
	lease := fs.Duration("lease", 30*time.Second, "lease per job; extended every half lease while it runs")
	count := fs.Int("count", 0, "stop after this many jobs are settled (0: run until SIGTERM)")
	_ = fs.Parse(args)

	stop, cancelStop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancelStop()
	w := &worker{client: client, lease: *lease, slots: make(chan struct{}, *concurrency), stop: cancelStop, left: *count}
	backoff := 100 * time.Millisecond
	for stop.Err() == nil {
		err := w.stream(stop, queue, uint32(*concurrency))
		w.running.Wait() // every job of that stream settled
		if stop.Err() != nil {
			break
		}
		switch status.Code(err) {
		case codes.InvalidArgument, codes.PermissionDenied, codes.Unauthenticated, codes.NotFound:
			log.Fatalf("subscribe: %v", err) // retrying cannot fix these
		}
		// Stream ended (a broker drain: UNAVAILABLE) or failed: reopen it
		// after a backoff with jitter.
		wait := time.Duration(float64(backoff) * (0.5 + rand.Float64()/2))
		log.Printf("stream ended (%v); reconnecting in %v", err, wait)
		select {
		case <-time.After(wait):
		case <-stop.Done():
		}
		if backoff *= 2; backoff > 10*time.Second {
			backoff = 10 * time.Second
		}
	}
}

type worker struct {
	client  leaseqv1.QueueServiceClient
	lease   time.Duration
	slots   chan struct{} // one per running job: at most -concurrency
	running sync.WaitGroup
	stop    context.CancelFunc
	mu      sync.Mutex
	left    int // jobs to settle before stopping (-count), if > 0
}

// stream holds one Subscribe stream open until it ends or stop is done; its
// unsettled jobs are released by the broker when it is cancelled.
func (w *worker) stream(stop context.Context, queue string, credit uint32) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sub, err := w.client.Subscribe(ctx, &leaseqv1.SubscribeRequest{
		Queues:      []string{queue},
		Consumer:    "go-example",
		MaxInFlight: credit,
		Lease:       durationpb.New(w.lease),
	})
	if err != nil {
		return err
	}
	deliveries := make(chan *leaseqv1.Delivery)
	errs := make(chan error, 1)
	go func() {
		for {
			msg, err := sub.Recv()
			if err != nil {
				errs <- err
				return
			}
			if d := msg.GetDelivery(); d != nil { // heartbeats need nothing
				select {
				case deliveries <- d:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	for {
		select {
		case <-stop.Done():
			// Graceful stop: running jobs finish and settle on this open
			// connection; then the stream is cancelled (deferred above),
			// which releases the rest at once.
			w.running.Wait()
			return nil
		case err := <-errs:
			return err
		case d := <-deliveries:
			w.slots <- struct{}{} // never blocks long: the broker honours the credit
			w.running.Add(1)
			go func() {
				defer func() { <-w.slots; w.running.Done() }()
				w.run(d)
			}()
		}
	}
}

// run handles one delivery: extends its lease every half lease while the
// handler runs, then acks or nacks with the current lease token.
func (w *worker) run(d *leaseqv1.Delivery) {
	job := d.Job
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- handle(ctx, job) }()
	tick := time.NewTicker(w.lease / 2)
	defer tick.Stop()
	var err error
wait:
	for {
		select {
		case err = <-done:
			break wait
		case <-tick.C:
			_, e := w.client.ExtendLease(context.Background(), &leaseqv1.ExtendLeaseRequest{
				JobId: job.Id, LeaseToken: d.LeaseToken, Lease: durationpb.New(w.lease),
			})
			if status.Code(e) == codes.FailedPrecondition {
				cancel() // the lease is gone: the job will be delivered again
				<-done
				log.Printf("job %s: lease lost", job.Id)
				return
			}
		}
	}
	call, cancelCall := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelCall()
	if err == nil {
		_, err = w.client.Ack(call, &leaseqv1.AckRequest{JobId: job.Id, LeaseToken: d.LeaseToken})
		if err == nil {
			fmt.Printf("handled %s %s attempt=%d\n", job.Id, job.Payload, job.Attempt)
		}
	} else {
		_, err = w.client.Nack(call, &leaseqv1.NackRequest{
			JobId: job.Id, LeaseToken: d.LeaseToken, Error: err.Error(),
			DeadLetter: errors.Is(err, errDeadLetter),
			RetryAfter: durationpb.New(0), // or leave it out: the queue's backoff
		})
		if err == nil {
			fmt.Printf("failed %s %s attempt=%d\n", job.Id, job.Payload, job.Attempt)
		}
	}
	switch status.Code(err) {
	case codes.OK:
		w.settled()
	case codes.FailedPrecondition:
		log.Printf("job %s: lease lost before settling", job.Id) // delivered again
	default:
		log.Printf("job %s: settle: %v", job.Id, err) // the lease runs out; delivered again
	}
}

func (w *worker) settled() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.left > 0 {
		if w.left--; w.left == 0 {
			w.stop()
		}
	}
}
