// berth-go-demo: a tour of berth from Go, one JSON line per step on stdout.
//
//	berth-go-demo [-session ID] [-lock-file PATH] [-admit-memory 512M]
//
// It appends to a session (and meets a seq conflict with its typed SeqConflict detail), watches it
// (the backlog, the caught-up marker, a live entry), holds a source lock on a Hold stream (and sees a
// second taker refused with a typed LockHeld), admits a need on the Admit stream (queued updates,
// then admitted, then released), and reads the details of a malformed request. The services are
// found as the berth command finds them (BERTH_SESSIONS_URL, BERTH_HOST and BERTH_*_PORT, the unix
// sockets, BERTH_TOKEN_FILE or BERTH_TOKEN: see docs/clients.md).
//
// With -e2e (test/go.test.ts) it leaves the live entry to the other side and, where the other side
// checks or acts, waits for {"go": NAME} on stdin. A failure prints {"step": "failed", "error": ...}
// and exits 1.
//
//	berth-go-demo resolve < cases.json
//
// prints, for each case of a JSON array ({"env": {...}, "sessions_url", "budget_url", "token",
// "token_file"}), where the client finds the services and its token, or the error.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"example.com/berth-go/berth"
	budgetv1 "example.com/berth-go/gen/berth/budget/v1"
	locksv1 "example.com/berth-go/gen/berth/locks/v1"
	sessionsv1 "example.com/berth-go/gen/berth/sessions/v1"
)

type facts = map[string]interface{}

func emit(step string, f facts) {
	line := facts{"step": step}
	for k, v := range f {
		line[k] = v
	}
	data, err := json.Marshal(line)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(data))
}

type tour struct {
	client    *berth.Client
	session   string
	lockFile  string
	memory    string
	e2e       bool
	stdin     *bufio.Scanner
	unaryTime time.Duration
}

// waitFor blocks until the other side says {"go": name} (only with -e2e).
func (t *tour) waitFor(name string) error {
	if !t.e2e {
		return nil
	}
	for t.stdin.Scan() {
		var line struct{ Go string }
		if json.Unmarshal(t.stdin.Bytes(), &line) == nil && line.Go == name {
			return nil
		}
	}
	return fmt.Errorf("stdin closed while waiting for %q", name)
}

// unary is a context for one unary call: a deadline, as every unary call should have.
func (t *tour) unary() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), t.unaryTime)
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "resolve" {
		if err := resolve(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "berth-go-demo resolve:", err)
			os.Exit(1)
		}
		return
	}
	t := &tour{stdin: bufio.NewScanner(os.Stdin), unaryTime: 10 * time.Second}
	flag.StringVar(&t.session, "session", fmt.Sprintf("go-demo-%d", time.Now().Unix()), "the session to write (a new one)")
	flag.StringVar(&t.lockFile, "lock-file", "src/app.css", "the file to lock (relative to the working directory; not touched)")
	flag.StringVar(&t.memory, "admit-memory", "512M", "the memory the admitted need declares")
	flag.BoolVar(&t.e2e, "e2e", false, "take part in test/go.test.ts (wait for go-aheads on stdin)")
	flag.Parse()

	client, err := berth.Dial(berth.Options{})
	if err == nil {
		t.client = client
		defer client.Close()
		err = t.run()
	}
	if err != nil {
		emit("failed", facts{"error": err.Error()})
		os.Exit(1)
	}
	emit("done", nil)
}

func (t *tour) run() error {
	for _, step := range []func() error{t.connect, t.appendAndConflict, t.watch, t.lock, t.admit, t.invalid} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

func (t *tour) connect() error {
	ctx, cancel := t.unary()
	defer cancel()
	sessions, err := t.client.SessionsHealth.Check(ctx, &grpc_health_v1.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("sessions at %s: %w", t.client.SessionsURL, err)
	}
	budget, err := t.client.BudgetHealth.Check(ctx, &grpc_health_v1.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("budget at %s: %w", t.client.BudgetURL, err)
	}
	emit("connected", facts{"sessions_url": t.client.SessionsURL, "budget_url": t.client.BudgetURL, "sessions_health": sessions.Status.String(), "budget_health": budget.Status.String()})
	return nil
}

// Appends two events (the first only if the session is new, the second only on top of the first),
// then one with a stale expected seq: ABORTED SEQ_CONFLICT, with a typed SeqConflict.
func (t *tour) appendAndConflict() error {
	ctx, cancel := t.unary()
	defer cancel()
	first, err := t.client.Sessions.AppendEvent(ctx, &sessionsv1.AppendEventRequest{
		SessionId: t.session,
		Event:     &sessionsv1.Event{Kind: &sessionsv1.Event_Generate{Generate: &sessionsv1.GenerateEvent{PageUrl: proto.String("/pricing"), Count: proto.Uint32(3)}}},
		Expected:  &sessionsv1.AppendEventRequest_ExpectedState{ExpectedState: sessionsv1.ExpectedState_EXPECTED_STATE_NO_SESSION},
	})
	if err != nil {
		return fmt.Errorf("append: %w", err)
	}
	second, err := t.client.Sessions.AppendEvent(ctx, &sessionsv1.AppendEventRequest{
		SessionId: t.session,
		Event:     phase("planning"),
		Expected:  &sessionsv1.AppendEventRequest_ExpectedSeq{ExpectedSeq: first.Seq},
	})
	if err != nil {
		return fmt.Errorf("append on top of %d: %w", first.Seq, err)
	}
	_, err = t.client.Sessions.AppendEvent(ctx, &sessionsv1.AppendEventRequest{
		SessionId: t.session,
		Event:     phase("building"),
		Expected:  &sessionsv1.AppendEventRequest_ExpectedSeq{ExpectedSeq: first.Seq},
	})
	conflict, ok := berth.Detail[*sessionsv1.SeqConflict](err)
	if !ok {
		return fmt.Errorf("a stale expected_seq: want SEQ_CONFLICT with a SeqConflict detail, got %v", err)
	}
	e := berth.ErrorOf(err)
	emit("appended", facts{
		"session": t.session, "seqs": []int64{first.Seq, second.Seq}, "phase": second.Snapshot.GetPhase(),
		"conflict_code": e.Code.String(), "conflict_reason": e.Reason, "conflict_domain": e.Domain,
		"conflict_expected_seq": conflict.ExpectedSeq, "conflict_current_seq": conflict.CurrentSeq, "conflict_facts": e.Facts,
	})
	return nil
}

func phase(name string) *sessionsv1.Event {
	return &sessionsv1.Event{Kind: &sessionsv1.Event_AgentPhase{AgentPhase: &sessionsv1.AgentPhaseEvent{Phase: proto.String(name)}}}
}

// Watches from seq 1: the backlog, one caught-up marker, then a live entry. No deadline on the
// stream (it lasts as long as the watch): cancelling its context ends it.
func (t *tour) watch() error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := t.client.Sessions.WatchSession(ctx, &sessionsv1.WatchSessionRequest{SessionId: t.session, FromSeq: 1, IncludeSnapshot: true})
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	var backlog []int64
	caughtUp := false
	for {
		message, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("watch: %w", err)
		}
		switch kind := message.Kind.(type) {
		case *sessionsv1.WatchSessionResponse_Entries:
			for _, watched := range kind.Entries.Entries {
				if !caughtUp {
					backlog = append(backlog, watched.Entry.Seq)
					continue
				}
				var event interface{}
				if data, err := protojsonEvent(watched.Entry.Event); err == nil {
					event = data
				}
				emit("watch_live", facts{"seq": watched.Entry.Seq, "type": watched.Entry.Type, "snapshot_phase": watched.Snapshot.GetPhase(), "event": event})
				return nil
			}
		case *sessionsv1.WatchSessionResponse_CaughtUp:
			caughtUp = true
			emit("watch_caught_up", facts{"backlog": backlog, "last_seq": kind.CaughtUp.LastSeq, "snapshot_phase": kind.CaughtUp.Snapshot.GetPhase()})
			if !t.e2e {
				// A live entry, from another call: the watcher sees it as it is written.
				uctx, ucancel := t.unary()
				_, err := t.client.Sessions.AppendEvent(uctx, &sessionsv1.AppendEventRequest{SessionId: t.session, Event: phase("building")})
				ucancel()
				if err != nil {
					return fmt.Errorf("live append: %w", err)
				}
			}
		}
	}
}

// Holds a lock on a Hold stream: granted, then a second taker that will not wait is refused with
// a typed LockHeld naming the holder; ending the stream frees the lock at once.
func (t *tour) lock() error {
	file, err := filepath.Abs(t.lockFile) // the service wants absolute paths: only we know our directory
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := t.client.Locks.Hold(ctx, &locksv1.HoldRequest{File: file, Owner: "go-demo", MaxWait: durationpb.New(30 * time.Second)})
	if err != nil {
		return fmt.Errorf("hold: %w", err)
	}
	var lease *locksv1.Lease
	for lease == nil {
		message, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("hold %s: %w", file, err)
		}
		switch kind := message.Kind.(type) {
		case *locksv1.HoldResponse_Waiting:
			emit("lock_waiting", facts{"position": kind.Waiting.Position, "holder": kind.Waiting.Holder.GetOwner()})
		case *locksv1.HoldResponse_Acquired:
			lease = kind.Acquired
		}
	}
	// Heartbeats keep coming while the lock is held; reading them is how a lost lock is noticed.
	lost := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				lost <- err
				return
			}
		}
	}()

	uctx, ucancel := t.unary()
	defer ucancel()
	_, err = t.client.Locks.Acquire(uctx, &locksv1.AcquireRequest{File: file, Owner: "go-demo-second", MaxWait: durationpb.New(0)})
	held, ok := berth.Detail[*locksv1.LockHeld](err)
	if !ok {
		return fmt.Errorf("a second taker: want WAIT_EXHAUSTED with a LockHeld detail, got %v", err)
	}
	busy := berth.ErrorOf(err)
	emit("lock_held", facts{
		"file": lease.File, "owner": lease.Owner, "fencing_token": lease.FencingToken,
		"busy_code": busy.Code.String(), "busy_reason": busy.Reason, "busy_retry_after_ms": busy.RetryAfter.Milliseconds(),
		"busy_owner": held.Owner, "busy_fencing_token": held.FencingToken, "busy_kind": held.Kind.String(),
	})
	if err := t.waitFor("release_lock"); err != nil {
		return err
	}
	select {
	case err := <-lost:
		return fmt.Errorf("lost the lock on %s: %w", lease.File, err)
	default:
	}
	cancel() // ends the stream: the service frees the lock
	emit("lock_released", facts{"file": lease.File})
	return nil
}

// Admits a need on the Admit stream: Queued updates while it waits, then Admitted with the
// reservation; a release message gives it back (so would ending the stream, or this process).
func (t *tour) admit() error {
	if err := t.waitFor("budget_held"); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stream, err := t.client.Budget.Admit(ctx)
	if err != nil {
		return fmt.Errorf("admit: %w", err)
	}
	need := &budgetv1.Need{Items: []*budgetv1.NeedItem{{
		Kind:       budgetv1.NeedItemKind_NEED_ITEM_KIND_START,
		Name:       "web",
		CostSource: &budgetv1.NeedItem_Spec{Spec: &budgetv1.ResourceSpec{Memory: proto.String(t.memory), Cpu: proto.Float64(0.5)}},
	}}}
	start := &budgetv1.AdmitRequest{Kind: &budgetv1.AdmitRequest_Start{Start: &budgetv1.AdmitStart{Need: need, Owner: "go-demo admit", MaxWait: durationpb.New(time.Minute)}}}
	if err := stream.Send(start); err != nil {
		return fmt.Errorf("admit: %w", err)
	}
	queued := 0
	var reservation *budgetv1.Reservation
	for reservation == nil {
		message, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("admit: %w", err)
		}
		switch kind := message.Kind.(type) {
		case *budgetv1.AdmitResponse_Queued:
			queued++
			if queued == 1 {
				// What it waits for names who holds it; the ETA says what it rests on, or why there is none.
				emit("admit_queued", facts{"position": kind.Queued.Position, "wait_for_text": kind.Queued.WaitForText, "eta_basis": kind.Queued.EtaBasis})
			}
		case *budgetv1.AdmitResponse_Admitted:
			reservation = kind.Admitted.Reservation
		}
	}
	emit("admitted", facts{"id": reservation.Id, "owner": reservation.Owner, "start_memory": reservation.Start.GetMemoryBytes(), "queued_updates": queued})
	if err := t.waitFor("admitted_seen"); err != nil {
		return err
	}
	if err := stream.Send(&budgetv1.AdmitRequest{Kind: &budgetv1.AdmitRequest_Release{Release: &budgetv1.ReleaseReservation{}}}); err != nil {
		return fmt.Errorf("admit release: %w", err)
	}
	for {
		message, err := stream.Recv()
		if err != nil {
			return fmt.Errorf("admit release: %w", err)
		}
		if released := message.GetReleased(); released != nil {
			emit("admit_released", facts{"id": released.ReservationId})
			break
		}
	}
	if err := stream.CloseSend(); err != nil {
		return err
	}
	// The service ends the stream once the reservation is gone.
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("admit: the stream went on after the release: %v", err)
	}
	return nil
}

// A malformed request: INVALID_ARGUMENT, the ErrorInfo reason, the field in the facts and in a
// BadRequest.
func (t *tour) invalid() error {
	ctx, cancel := t.unary()
	defer cancel()
	_, err := t.client.Sessions.AppendEvent(ctx, &sessionsv1.AppendEventRequest{SessionId: "not a valid id!", Event: phase("x")})
	e := berth.ErrorOf(err)
	if e == nil {
		return fmt.Errorf("a malformed session id: want INVALID_ARGUMENT, got %v", err)
	}
	var fields []string
	if bad, ok := berth.Detail[*errdetails.BadRequest](err); ok {
		for _, v := range bad.FieldViolations {
			fields = append(fields, v.Field)
		}
	}
	emit("invalid_argument", facts{"code": e.Code.String(), "reason": e.Reason, "field": e.Facts["field"], "violations": fields, "message": e.Message})
	return nil
}
