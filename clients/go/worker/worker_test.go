package worker_test

// Against a live broker at LEASEQ_ADDR (tests/go_example.rs starts one and
// runs `go test -v`); without LEASEQ_ADDR the tests are skipped.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	leaseqv1 "github.com/leaseq/leaseq/clients/go/leaseq/v1"
	"github.com/leaseq/leaseq/clients/go/worker"
)

func dial(t *testing.T) *grpc.ClientConn {
	addr := os.Getenv("LEASEQ_ADDR")
	if addr == "" {
		t.Skip("LEASEQ_ADDR is not set: no broker to test against")
	}
	addr = strings.TrimPrefix(addr, "http://")
	conn, err := grpc.Dial(addr, grpc.WithInsecure())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func queueName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

func enqueue(t *testing.T, conn *grpc.ClientConn, queue string, payloads ...string) {
	c := leaseqv1.NewQueueServiceClient(conn)
	for _, p := range payloads {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.Enqueue(ctx, &leaseqv1.EnqueueRequest{Queue: queue, Payload: []byte(p)})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
}

func stats(t *testing.T, conn *grpc.ClientConn, queue string) *leaseqv1.QueueStats {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q, err := leaseqv1.NewAdminServiceClient(conn).GetQueue(ctx, &leaseqv1.GetQueueRequest{Queue: queue})
	if err != nil {
		t.Fatal(err)
	}
	return q.Stats
}

// eventually polls check every 50 ms until it holds or limit passes.
func eventually(t *testing.T, limit time.Duration, what string, check func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !check() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func quiet(string, ...interface{}) {}

// A handler per queue; nil acks, an error retries, DeadLetter dead-letters,
// all settled on the Consume stream; Run returns nil once stopped.
func TestHandlersPerQueueSettleTheirJobs(t *testing.T) {
	conn := dial(t)
	mail, pay := queueName("go-mail"), queueName("go-pay")
	var mu sync.Mutex
	seen := map[string][]int32{}
	record := func(job *leaseqv1.Job) {
		mu.Lock()
		defer mu.Unlock()
		seen[job.Queue+"/"+string(job.Payload)] = append(seen[job.Queue+"/"+string(job.Payload)], job.Attempt)
	}
	w := worker.New(conn, worker.Options{Concurrency: 4, Logf: quiet}).
		Handle(mail, func(ctx context.Context, job *leaseqv1.Job) error {
			record(job)
			return nil
		}).
		Handle(pay, func(ctx context.Context, job *leaseqv1.Job) error {
			record(job)
			switch {
			case string(job.Payload) == "dead":
				return worker.DeadLetter(errors.New("bad input"))
			case job.Attempt == 1:
				return worker.RetryAfter(0, fmt.Errorf("busy"))
			}
			return nil
		})
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	enqueue(t, conn, mail, "hello")
	enqueue(t, conn, pay, "retry", "dead")
	eventually(t, 20*time.Second, "every job settled", func() bool {
		m, p := stats(t, conn, mail), stats(t, conn, pay)
		return m.Available+m.Leased+m.Scheduled == 0 && p.Available+p.Leased+p.Scheduled == 0 && p.Dead == 1
	})
	stop()
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after its context was cancelled")
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]string{
		mail + "/hello": "[1]",
		pay + "/retry":  "[1 2]",
		pay + "/dead":   "[1]",
	}
	for k, v := range want {
		if got := fmt.Sprint(seen[k]); got != v {
			t.Errorf("%s: attempts %s, want %s (all: %v)", k, got, v, seen)
		}
	}
}

// Graceful stop: the running handlers finish and their acks go out; the
// job delivered but never started is released; Run returns nil.
func TestGracefulStopFinishesRunningJobsAndReleasesTheRest(t *testing.T) {
	conn := dial(t)
	q := queueName("go-stop")
	started := make(chan string, 10)
	release := make(chan struct{})
	w := worker.New(conn, worker.Options{Concurrency: 2, Logf: quiet}).
		Handle(q, func(ctx context.Context, job *leaseqv1.Job) error {
			started <- string(job.Payload)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	enqueue(t, conn, q, "a", "b", "c")
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	for i := 0; i < 2; i++ {
		select {
		case <-started:
		case <-time.After(20 * time.Second):
			t.Fatal("two jobs did not start")
		}
	}
	stop()
	select {
	case err := <-ran:
		t.Fatalf("Run returned (%v) while handlers were running", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-ran:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not return after its handlers finished")
	}
	s := stats(t, conn, q)
	if s.Available != 1 || s.Leased != 0 || s.Dead != 0 {
		t.Fatalf("after the stop: %d available, %d leased, %d dead; want 1, 0, 0", s.Available, s.Leased, s.Dead)
	}
	if len(started) != 0 {
		t.Fatalf("a job started after the stop: %s", <-started)
	}
}

// Per-key limits hold for a Go worker with room to spare: in a queue with
// key_concurrency 1 and a key override giving "vip" 2, at most 1 job of
// "std" and 2 of "vip" run at once, however many the worker could run; the
// settings come back as set.
func TestPerKeyLimitsHoldWhateverTheWorkersConcurrency(t *testing.T) {
	conn := dial(t)
	q := queueName("go-keys")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	one := int32(1)
	info, err := leaseqv1.NewAdminServiceClient(conn).UpdateQueue(ctx, &leaseqv1.UpdateQueueRequest{
		Queue:          q,
		Create:         true,
		KeyConcurrency: &one,
		KeyOverrides: &leaseqv1.KeyOverrides{Overrides: []*leaseqv1.KeyOverride{
			{Key: "vip", Concurrency: 2},
		}},
	})
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	s := info.Settings
	if s.KeyConcurrency != 1 || s.OrderedByKey || len(s.KeyOverrides) != 1 ||
		s.KeyOverrides[0].Key != "vip" || s.KeyOverrides[0].Concurrency != 2 {
		t.Fatalf("settings: %v", s)
	}

	var mu sync.Mutex
	running, most := map[string]int{}, map[string]int{}
	w := worker.New(conn, worker.Options{Concurrency: 8, Logf: quiet}).
		Handle(q, func(ctx context.Context, job *leaseqv1.Job) error {
			mu.Lock()
			running[job.Key]++
			if running[job.Key] > most[job.Key] {
				most[job.Key] = running[job.Key]
			}
			mu.Unlock()
			time.Sleep(300 * time.Millisecond) // long enough for the others to start, if they may
			mu.Lock()
			running[job.Key]--
			mu.Unlock()
			return nil
		})
	c := leaseqv1.NewQueueServiceClient(conn)
	for _, key := range []string{"vip", "vip", "vip", "std", "std", "std"} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := c.Enqueue(ctx, &leaseqv1.EnqueueRequest{Queue: q, Payload: []byte(key), Key: key})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	runCtx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	eventually(t, 20*time.Second, "every job settled", func() bool {
		st := stats(t, conn, q)
		return st.Available+st.Leased+st.Scheduled == 0
	})
	stop()
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if most["std"] != 1 || most["vip"] != 2 {
		t.Fatalf("most at once: std %d, vip %d; want 1 and 2", most["std"], most["vip"])
	}
}
