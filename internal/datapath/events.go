package datapath

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/policy"
)

// Events is the flow event ring buffer and its loss counter.
type Events struct{ *handle }

// EventReader reads flow events from the ring buffer. Use one reader at a time per
// Datapath: events are consumed by whoever reads them first.
type EventReader struct {
	ring polledRing
	// wall - monotonic at creation, to convert kernel timestamps.
	offset time.Duration
}

// Lost returns how many flow events were not sent because the ring buffer was full.
func (d *Events) Lost() (uint64, error) {
	var (
		zero uint32
		per  []uint64
	)
	if err := d.objs.EventsLost.Lookup(&zero, &per); err != nil {
		return 0, fmt.Errorf("reading lost event count: %w", err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}

// EventPoll is how late an event may be read: the programs wake the reader only when an
// event fills a quarter of its ring (flow events: bpf/include/events.h, emit_event;
// send-side verdict events: bpf/sockverdict.c, emit), so readers poll.
const EventPoll = 50 * time.Millisecond

// polledRing reads a ring buffer whose producers do not wake the reader for each record:
// it waits at most EventPoll at a time, and reads what arrived meanwhile.
type polledRing struct {
	rd       *ringbuf.Reader
	deadline time.Time // the caller's (zero: none)
	rec      ringbuf.Record
	// drained counts the times a read found the ring empty (see EventReader.Drained).
	drained atomic.Uint64
}

// next returns the next record's bytes (valid until the next call), or
// os.ErrDeadlineExceeded once the deadline has passed without one.
func (p *polledRing) next() ([]byte, error) {
	for {
		wake := time.Now().Add(EventPoll)
		if !p.deadline.IsZero() && p.deadline.Before(wake) {
			wake = p.deadline
		}
		p.rd.SetDeadline(wake)
		err := p.rd.ReadInto(&p.rec)
		if err == nil {
			return p.rec.RawSample, nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, err
		}
		p.drained.Add(1) // the wait timed out and nothing was left to read
		if !p.deadline.IsZero() && !time.Now().Before(p.deadline) {
			return nil, err
		}
	}
}

// Reader opens a reader on the flow event ring buffer.
func (d *Events) Reader() (*EventReader, error) {
	rd, err := ringbuf.NewReader(d.objs.Events)
	if err != nil {
		return nil, fmt.Errorf("opening flow event reader: %w", err)
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		rd.Close()
		return nil, fmt.Errorf("reading monotonic clock: %w", err)
	}
	offset := time.Duration(time.Now().UnixNano() - ts.Nano())
	return &EventReader{ring: polledRing{rd: rd}, offset: offset}, nil
}

// Read blocks until an event arrives, the deadline passes (os.ErrDeadlineExceeded) or the
// reader is closed (os.ErrClosed, also ringbuf.ErrClosed).
func (r *EventReader) Read() (flow.Event, error) {
	raw, err := r.ring.next()
	if err != nil {
		return flow.Event{}, fmt.Errorf("reading flow event: %w", err)
	}
	return decodeEvent(raw, r.offset)
}

// SetDeadline makes Read return os.ErrDeadlineExceeded once t has passed (zero: no deadline).
func (r *EventReader) SetDeadline(t time.Time) { r.ring.deadline = t }

// Drained counts the times Read found the ring empty, which it checks at least every
// EventPoll while it is called. Once the count has grown by two since a moment, every
// event written before that moment has been returned by Read (one more empty ring may
// have been seen just before the moment). Safe to call from any goroutine.
func (r *EventReader) Drained() uint64 { return r.ring.drained.Load() }

// Close stops the reader; a blocked Read returns.
func (r *EventReader) Close() error {
	if err := r.ring.rd.Close(); err != nil {
		return fmt.Errorf("closing flow event reader: %w", err)
	}
	return nil
}

func decodeEvent(raw []byte, offset time.Duration) (flow.Event, error) {
	var e rampartFlowEvent
	if err := binary.Read(bytes.NewReader(raw), binary.NativeEndian, &e); err != nil {
		return flow.Event{}, fmt.Errorf("decoding flow event (%d bytes): %w", len(raw), err)
	}
	// The codes' Go types are generated from the same enums as the struct's field types
	// (internal/flow), so these conversions keep their values and meaning.
	out := flow.Event{
		Monotonic:       time.Duration(e.TimestampNs),
		Type:            flow.EventType(e.Type),
		Verdict:         flow.Verdict(e.Verdict),
		Reason:          flow.Reason(e.Reason),
		Direction:       policy.Direction(e.Direction),
		Protocol:        policy.Protocol(e.Protocol),
		SourcePort:      ntohs(e.Sport),
		DestinationPort: ntohs(e.Dport),
		ICMPType:        e.IcmpType,
		EpID:            e.EpId,
		SrcIdentity:     e.SrcIdentity,
		DstIdentity:     e.DstIdentity,
		RuleID:          e.RuleId,
		MatchIdentity:   e.MatchIdentity,
		IfIndex:         e.Ifindex,
		Length:          e.Length,
		Flags:           flow.Flags(e.Flags),
	}
	out.Time = time.Unix(0, 0).Add(offset + out.Monotonic)
	switch e.Family {
	case familyV4:
		out.Source = netip.AddrFrom4([4]byte(e.Saddr[:4]))
		out.Destination = netip.AddrFrom4([4]byte(e.Daddr[:4]))
	case familyV6:
		out.Source = netip.AddrFrom16(e.Saddr)
		out.Destination = netip.AddrFrom16(e.Daddr)
	}
	return out, nil
}
