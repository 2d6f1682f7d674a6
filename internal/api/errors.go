package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/rampartnet/rampart/internal/labels"
)

// Errorf returns an *Error with an HTTP status; the agent uses it to tell the client what
// kind of failure happened (400 bad input, 404 not found, 409 conflict).
func Errorf(status int, format string, args ...any) *Error {
	// Names and labels in messages come from requests, which may hold megabytes of them.
	for i, a := range args {
		if s, ok := a.(string); ok {
			args[i] = labels.Shorten(s)
		}
	}
	return &Error{Status: status, Message: fmt.Sprintf(format, args...)}
}

// BadRequest is an *Error with status 400.
func BadRequest(format string, args ...any) *Error {
	return Errorf(http.StatusBadRequest, format, args...)
}

// NotFound is an *Error with status 404.
func NotFound(format string, args ...any) *Error {
	return Errorf(http.StatusNotFound, format, args...)
}

// Conflict is an *Error with status 409.
func Conflict(format string, args ...any) *Error {
	return Errorf(http.StatusConflict, format, args...)
}

// IsNotFound reports whether err is an *Error with status 404.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

func statusOf(err error) int {
	var e *Error
	if errors.As(err, &e) && e.Status != 0 {
		return e.Status
	}
	return http.StatusInternalServerError
}
