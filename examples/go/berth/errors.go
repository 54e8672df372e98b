package berth

import (
	"time"

	"github.com/golang/protobuf/proto"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
)

// Error is a failed berth call with the details the service sent in grpc-status-details-bin (a
// google.rpc.Status), decoded: every berth error has an ErrorInfo whose Reason names the case
// (SEQ_CONFLICT, WAIT_EXHAUSTED, INVALID_FIELD...), a RetryInfo where a retry can succeed, a Struct
// of facts, and the typed detail the proto names (SeqConflict, LockHeld, Refusal...): Detail picks
// one by type. A detail whose type is not linked into the program stays out of Details.
type Error struct {
	Code    codes.Code
	Message string
	// Reason and Domain come from the ErrorInfo ("" without one).
	Reason, Domain string
	// RetryAfter comes from the RetryInfo (0 without one).
	RetryAfter time.Duration
	// Facts is the Struct detail as a map (field and rule for INVALID_ARGUMENT, the current seq of a
	// conflict...); nil without one.
	Facts map[string]interface{}
	// Details are the decoded messages. proto.Message is golang/protobuf's (what grpc-go's status
	// package decodes to): genproto's ErrorInfo in Debian predates the newer API, and berth's own
	// generated messages implement both.
	Details []proto.Message
}

func (e *Error) Error() string { return e.Code.String() + " " + e.Reason + ": " + e.Message }

// ErrorOf reads a grpc-go error; nil for nil, and for an error that is not a gRPC status.
func ErrorOf(err error) *Error {
	if err == nil {
		return nil
	}
	s, ok := status.FromError(err)
	if !ok {
		return nil
	}
	e := &Error{Code: s.Code(), Message: s.Message()}
	for _, detail := range s.Details() {
		message, ok := detail.(proto.Message)
		if !ok {
			continue // an Any whose type this program does not know: Details() returns its error
		}
		e.Details = append(e.Details, message)
		switch d := message.(type) {
		case *errdetails.ErrorInfo:
			e.Reason, e.Domain = d.GetReason(), d.GetDomain()
		case *errdetails.RetryInfo:
			if delay := d.GetRetryDelay(); delay != nil {
				e.RetryAfter = time.Duration(delay.GetSeconds())*time.Second + time.Duration(delay.GetNanos())
			}
		case *structpb.Struct:
			e.Facts = d.AsMap()
		}
	}
	return e
}

// Detail is the first detail of type T that err carries:
//
//	if conflict, ok := berth.Detail[*sessionsv1.SeqConflict](err); ok { ... conflict.CurrentSeq ... }
func Detail[T proto.Message](err error) (T, bool) {
	var zero T
	e := ErrorOf(err)
	if e == nil {
		return zero, false
	}
	for _, detail := range e.Details {
		if d, ok := detail.(T); ok {
			return d, true
		}
	}
	return zero, false
}
