package datastore

import (
	"context"
	"errors"
	"fmt"
	"net"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Reasons are short CamelCase words for the Reason of Kubernetes conditions.
const (
	// ReasonUnreachable: no etcd endpoint answered in time (connection
	// refused, timeout, no leader).
	ReasonUnreachable = "Unreachable"
	// ReasonTLSFailed: an endpoint was reached but the TLS handshake failed:
	// the server certificate is not signed by CACert, or etcd rejected the
	// client certificate.
	ReasonTLSFailed = "TLSFailed"
	// ReasonAuthDisabled: etcd answers but auth is off, so tenants would
	// not be isolated from each other.
	ReasonAuthDisabled = "AuthDisabled"
	// ReasonAuthFailed: etcd does not know the user named by the client
	// certificate.
	ReasonAuthFailed = "AuthFailed"
	// ReasonInvalidCredentials: the PEM material in the Config does not
	// parse or does not fit together.
	ReasonInvalidCredentials = "InvalidCredentials"
	// ReasonInvalidConfig: the Config is unusable for another reason (no
	// endpoint, not https).
	ReasonInvalidConfig = "InvalidConfig"
	// ReasonInvalidTenant: the Tenant would not be confined to its own range.
	ReasonInvalidTenant = "InvalidTenant"
	// ReasonPermissionDenied: the user is known but lacks the permission
	// (the operator's certificate is not the root user's).
	ReasonPermissionDenied = "PermissionDenied"
	// ReasonNoSpace: etcd raised its NOSPACE alarm and refuses writes.
	ReasonNoSpace = "NoSpace"
	// ReasonCanceled: the caller canceled the context.
	ReasonCanceled = "Canceled"
	// ReasonUnsupportedVersion: etcd is older than MinVersion.
	ReasonUnsupportedVersion = "UnsupportedVersion"
	// ReasonError is for every other error.
	ReasonError = "Error"
)

// Error carries a short CamelCase Reason for Kubernetes conditions and the
// error that explains it, whose text is the condition message.
type Error struct {
	Reason string
	Err    error
}

func (e *Error) Error() string {
	if e.Err == nil {
		return e.Reason
	}
	return e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// ReasonOf returns the Reason of an *Error in the chain, or ReasonError. It
// returns "" for a nil error.
func ReasonOf(err error) string {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) && e.Reason != "" {
		return e.Reason
	}
	return ReasonError
}

// wrapf adds context to an etcd error and classifies it; an error that
// already carries a Reason keeps it.
func wrapf(err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return &Error{Reason: reasonFor(err), Err: fmt.Errorf(format+": %w", append(args, err)...)}
}

// reasonFor maps etcd client errors to Reasons.
func reasonFor(err error) string {
	var e *Error
	if errors.As(err, &e) && e.Reason != "" {
		return e.Reason
	}
	switch {
	case errors.Is(err, rpctypes.ErrPermissionDenied):
		return ReasonPermissionDenied
	// ErrUserNotFound is what an admin-only call returns when the
	// certificate's CN names no etcd user; callers that look a tenant user
	// up handle it before it gets here.
	case errors.Is(err, rpctypes.ErrAuthFailed),
		errors.Is(err, rpctypes.ErrInvalidAuthToken),
		errors.Is(err, rpctypes.ErrUserEmpty),
		errors.Is(err, rpctypes.ErrUserNotFound),
		errors.Is(err, rpctypes.ErrRootUserNotExist),
		errors.Is(err, rpctypes.ErrRootRoleNotExist):
		return ReasonAuthFailed
	case errors.Is(err, rpctypes.ErrAuthNotEnabled):
		return ReasonAuthDisabled
	case errors.Is(err, rpctypes.ErrNoSpace):
		return ReasonNoSpace
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, rpctypes.ErrNoLeader),
		errors.Is(err, rpctypes.ErrLeaderChanged),
		errors.Is(err, rpctypes.ErrTimeout),
		errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail),
		errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost),
		errors.Is(err, rpctypes.ErrStopped),
		errors.Is(err, rpctypes.ErrUnhealthy):
		return ReasonUnreachable
	case errors.Is(err, context.Canceled):
		return ReasonCanceled
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return ReasonUnreachable
	}
	// Transport errors that clientv3 does not translate keep their gRPC
	// status code.
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return ReasonUnreachable
	case codes.PermissionDenied:
		return ReasonPermissionDenied
	case codes.Unauthenticated:
		return ReasonAuthFailed
	case codes.Canceled:
		return ReasonCanceled
	}
	return ReasonError
}
