package suricata

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"
)

// Event types of the EVE output that Rampart reads.
const (
	TypeAlert = "alert"
	TypeDrop  = "drop"
	TypeFlow  = "flow"
	TypeHTTP  = "http"
	TypePgSQL = "pgsql"
	TypeStats = "stats"
)

// Action is what Suricata did with the packet that raised an alert.
type Action string

const (
	// Allowed: the packet went on (any alert of a passive monitor; an alert rule inline).
	Allowed Action = "allowed"
	// Blocked: an inline monitor dropped the packet (a drop or reject rule).
	Blocked Action = "blocked"
)

// FiveTuple is a flow's addresses, ports and protocol as Suricata saw them: Src is the side
// that started the flow (for a flow event) or sent the packet (alert, drop), Dst the other.
// ICMP flows have port 0.
type FiveTuple struct {
	Proto string // "TCP", "UDP", "ICMP", "IPv6-ICMP", ...
	Src   netip.AddrPort
	Dst   netip.AddrPort
}

func (f FiveTuple) String() string {
	return fmt.Sprintf("%s %s -> %s", f.Proto, f.Src, f.Dst)
}

// Reverse is the tuple seen from the other side.
func (f FiveTuple) Reverse() FiveTuple {
	return FiveTuple{Proto: f.Proto, Src: f.Dst, Dst: f.Src}
}

// Event is one EVE record. Exactly one of Alert, Drop, Flow, HTTP, PgSQL and Stats is set
// for the types of the same name (an alert record also carries HTTP or PgSQL when the alert was on
// such a transaction); Raw keeps the whole record for anything else.
type Event struct {
	Time      time.Time
	Type      string
	FlowID    uint64
	Interface string // the capture interface
	Tuple     FiveTuple
	AppProto  string // "http", "pgsql", ... when detected
	Direction string // "to_server" or "to_client" (alert, drop)

	Alert *Alert
	Drop  *Drop
	Flow  *Flow
	HTTP  *HTTP
	PgSQL *PgSQL
	Stats *Stats

	Raw json.RawMessage
}

// Alert is a rule match.
type Alert struct {
	Action      Action
	GID         int
	SignatureID int
	Rev         int
	Signature   string // the rule's msg
	Category    string
	Severity    int
}

// Drop is a packet an inline monitor dropped.
type Drop struct {
	Len    int
	Reason string // e.g. "rules", "stream error"; empty when Suricata gives none
	SYN    bool
	ACK    bool
	RST    bool
	FIN    bool
}

// Flow is the end-of-flow summary (or a timeout's).
type Flow struct {
	PktsToServer, PktsToClient   uint64
	BytesToServer, BytesToClient uint64
	Start, End                   time.Time
	State                        string // "new", "established", "closed", ...
	Reason                       string // "timeout", "forced", "shutdown"
	Alerted                      bool
	Action                       string // "drop" when an inline monitor dropped the flow
}

// Stats are Suricata's capture counters, totals since it started, from a stats record
// (one per stats interval): packets the kernel handed it (AF_PACKET) and packets the
// kernel dropped because its capture ring was full, that is copies the monitor lost.
type Stats struct {
	KernelPackets uint64
	KernelDrops   uint64
}

// HTTP is one HTTP transaction.
type HTTP struct {
	Hostname  string
	URL       string
	Method    string
	Protocol  string
	Status    int
	UserAgent string
	Length    int
}

// PgSQL is one PostgreSQL transaction: a request from the client and the server's
// response to it. Request and Response keep the whole objects; the common fields are
// decoded.
type PgSQL struct {
	TxID        uint64
	SimpleQuery string // the request's simple query (SQL text), if it was one
	// User and Database are the startup message's, in the session's first transaction.
	User, Database string
	// CommandCompleted is the response's completion tag ("INSERT 0 1", "SELECT 3").
	CommandCompleted string
	DataRows         int
	// ErrorCode (SQLSTATE) and ErrorMessage are set when the response was an error.
	ErrorCode, ErrorMessage string
	Request                 json.RawMessage
	Response                json.RawMessage
}

// eveTime is EVE's timestamp layout (microseconds, numeric zone without colon).
const eveTime = "2006-01-02T15:04:05.999999-0700"

type wireEvent struct {
	Timestamp string `json:"timestamp"`
	FlowID    uint64 `json:"flow_id"`
	InIface   string `json:"in_iface"`
	EventType string `json:"event_type"`
	SrcIP     string `json:"src_ip"`
	SrcPort   uint16 `json:"src_port"`
	DestIP    string `json:"dest_ip"`
	DestPort  uint16 `json:"dest_port"`
	Proto     string `json:"proto"`
	AppProto  string `json:"app_proto"`
	Direction string `json:"direction"`
	Alert     *struct {
		Action      string `json:"action"`
		GID         int    `json:"gid"`
		SignatureID int    `json:"signature_id"`
		Rev         int    `json:"rev"`
		Signature   string `json:"signature"`
		Category    string `json:"category"`
		Severity    int    `json:"severity"`
	} `json:"alert"`
	Drop *struct {
		Len    int    `json:"len"`
		Reason string `json:"reason"`
		SYN    bool   `json:"syn"`
		ACK    bool   `json:"ack"`
		RST    bool   `json:"rst"`
		FIN    bool   `json:"fin"`
	} `json:"drop"`
	Flow *struct {
		PktsToServer  uint64 `json:"pkts_toserver"`
		PktsToClient  uint64 `json:"pkts_toclient"`
		BytesToServer uint64 `json:"bytes_toserver"`
		BytesToClient uint64 `json:"bytes_toclient"`
		Start         string `json:"start"`
		End           string `json:"end"`
		State         string `json:"state"`
		Reason        string `json:"reason"`
		Alerted       bool   `json:"alerted"`
		Action        string `json:"action"`
	} `json:"flow"`
	HTTP *struct {
		Hostname  string `json:"hostname"`
		URL       string `json:"url"`
		Method    string `json:"http_method"`
		Protocol  string `json:"protocol"`
		Status    int    `json:"status"`
		UserAgent string `json:"http_user_agent"`
		Length    int    `json:"length"`
	} `json:"http"`
	PgSQL *struct {
		TxID     uint64          `json:"tx_id"`
		Request  json.RawMessage `json:"request"`
		Response json.RawMessage `json:"response"`
	} `json:"pgsql"`
	Stats *struct {
		Capture struct {
			KernelPackets uint64 `json:"kernel_packets"`
			KernelDrops   uint64 `json:"kernel_drops"`
		} `json:"capture"`
	} `json:"stats"`
}

// ParseEvent decodes one EVE line.
func ParseEvent(line []byte) (Event, error) {
	var w wireEvent
	if err := json.Unmarshal(line, &w); err != nil {
		return Event{}, fmt.Errorf("decoding eve record: %w", err)
	}
	if w.EventType == "" {
		return Event{}, errors.New("decoding eve record: no event_type")
	}
	ev := Event{
		Type: w.EventType, FlowID: w.FlowID, Interface: w.InIface, AppProto: w.AppProto,
		Direction: w.Direction, Raw: json.RawMessage(bytes.Clone(line)),
	}
	var err error
	if ev.Time, err = time.Parse(eveTime, w.Timestamp); err != nil {
		return Event{}, fmt.Errorf("decoding eve %s record: timestamp: %w", w.EventType, err)
	}
	// Records of the engine itself (stats) have no flow.
	if w.SrcIP != "" {
		src, err := netip.ParseAddr(w.SrcIP)
		if err != nil {
			return Event{}, fmt.Errorf("decoding eve %s record: src_ip: %w", w.EventType, err)
		}
		dst, err := netip.ParseAddr(w.DestIP)
		if err != nil {
			return Event{}, fmt.Errorf("decoding eve %s record: dest_ip: %w", w.EventType, err)
		}
		ev.Tuple = FiveTuple{Proto: w.Proto, Src: netip.AddrPortFrom(src.Unmap(), w.SrcPort), Dst: netip.AddrPortFrom(dst.Unmap(), w.DestPort)}
	}
	if a := w.Alert; a != nil {
		ev.Alert = &Alert{Action: Action(a.Action), GID: a.GID, SignatureID: a.SignatureID, Rev: a.Rev,
			Signature: a.Signature, Category: a.Category, Severity: a.Severity}
	}
	if d := w.Drop; d != nil && w.EventType == TypeDrop {
		ev.Drop = &Drop{Len: d.Len, Reason: d.Reason, SYN: d.SYN, ACK: d.ACK, RST: d.RST, FIN: d.FIN}
	}
	if f := w.Flow; f != nil && w.EventType == TypeFlow {
		fl := &Flow{PktsToServer: f.PktsToServer, PktsToClient: f.PktsToClient, BytesToServer: f.BytesToServer,
			BytesToClient: f.BytesToClient, State: f.State, Reason: f.Reason, Alerted: f.Alerted, Action: f.Action}
		if fl.Start, err = time.Parse(eveTime, f.Start); err != nil {
			return Event{}, fmt.Errorf("decoding eve flow record: start: %w", err)
		}
		if fl.End, err = time.Parse(eveTime, f.End); err != nil {
			return Event{}, fmt.Errorf("decoding eve flow record: end: %w", err)
		}
		ev.Flow = fl
	}
	if h := w.HTTP; h != nil {
		ev.HTTP = &HTTP{Hostname: h.Hostname, URL: h.URL, Method: h.Method, Protocol: h.Protocol,
			Status: h.Status, UserAgent: h.UserAgent, Length: h.Length}
	}
	if st := w.Stats; st != nil && w.EventType == TypeStats {
		ev.Stats = &Stats{KernelPackets: st.Capture.KernelPackets, KernelDrops: st.Capture.KernelDrops}
	}
	if p := w.PgSQL; p != nil {
		ev.PgSQL, err = decodePgSQL(p.TxID, p.Request, p.Response)
		if err != nil {
			return Event{}, fmt.Errorf("decoding eve %s record: %w", w.EventType, err)
		}
	}
	return ev, nil
}

func decodePgSQL(txID uint64, req, resp json.RawMessage) (*PgSQL, error) {
	p := &PgSQL{TxID: txID, Request: req, Response: resp}
	if len(req) > 0 {
		var r struct {
			SimpleQuery string `json:"simple_query"`
			Startup     *struct {
				User     string              `json:"user"`
				Optional []map[string]string `json:"optional_parameters"`
			} `json:"startup_parameters"`
		}
		if err := json.Unmarshal(req, &r); err != nil {
			return nil, fmt.Errorf("pgsql request: %w", err)
		}
		p.SimpleQuery = r.SimpleQuery
		if r.Startup != nil {
			p.User = r.Startup.User
			for _, o := range r.Startup.Optional {
				if db, ok := o["database"]; ok {
					p.Database = db
				}
			}
		}
	}
	if len(resp) > 0 {
		// "message" is the kind of a response without fields of its own
		// ("authentication_ok"), or an error's text: an error has a code.
		var r struct {
			CommandCompleted string `json:"command_completed"`
			DataRows         int    `json:"data_rows"`
			Code             string `json:"code"`
			Message          string `json:"message"`
		}
		if err := json.Unmarshal(resp, &r); err != nil {
			return nil, fmt.Errorf("pgsql response: %w", err)
		}
		p.CommandCompleted, p.DataRows = r.CommandCompleted, r.DataRows
		if r.Code != "" {
			p.ErrorCode, p.ErrorMessage = r.Code, r.Message
		}
	}
	return p, nil
}

// Reader reads an EVE file as Suricata appends to it, from where the last call stopped.
// A line still being written (no newline yet) is left for the next call.
type Reader struct {
	path   string
	offset int64
}

// NewReader reads the EVE file at path from its start.
func NewReader(path string) *Reader { return &Reader{path: path} }

// Next returns the events appended since the last call. A missing file (Suricata has not
// written an event yet) is no events.
func (r *Reader) Next() ([]Event, error) {
	f, err := os.Open(r.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening eve file: %w", err)
	}
	defer f.Close()
	if _, err := f.Seek(r.offset, io.SeekStart); err != nil {
		return nil, fmt.Errorf("reading eve file %s: %w", r.path, err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("reading eve file %s: %w", r.path, err)
	}
	end := bytes.LastIndexByte(data, '\n')
	if end < 0 {
		return nil, nil
	}
	var evs []Event
	var first error
	for i, line := range bytes.Split(data[:end], []byte{'\n'}) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		ev, err := ParseEvent(line)
		if err != nil {
			// A bad record is reported and skipped, so that it does not stop the reader
			// for good.
			if first == nil {
				first = fmt.Errorf("%s, record %d after offset %d: %w", r.path, i+1, r.offset, err)
			}
			continue
		}
		evs = append(evs, ev)
	}
	r.offset += int64(end + 1)
	return evs, first
}

// String describes e in one line, for logs and test failures.
func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s flow %d %s", e.Time.Format(time.RFC3339Nano), e.Type, e.FlowID, e.Tuple)
	switch {
	case e.Alert != nil:
		fmt.Fprintf(&b, " [%d:%d:%d] %q %s", e.Alert.GID, e.Alert.SignatureID, e.Alert.Rev, e.Alert.Signature, e.Alert.Action)
	case e.Drop != nil:
		fmt.Fprintf(&b, " len %d %s", e.Drop.Len, e.Drop.Reason)
	case e.Flow != nil:
		fmt.Fprintf(&b, " %s pkts %d/%d alerted %v", e.Flow.State, e.Flow.PktsToServer, e.Flow.PktsToClient, e.Flow.Alerted)
	case e.PgSQL != nil:
		fmt.Fprintf(&b, " query %q completed %q", e.PgSQL.SimpleQuery, e.PgSQL.CommandCompleted)
	case e.HTTP != nil:
		fmt.Fprintf(&b, " %s %s%s %d", e.HTTP.Method, e.HTTP.Hostname, e.HTTP.URL, e.HTTP.Status)
	case e.Stats != nil:
		fmt.Fprintf(&b, " capture kernel packets %d drops %d", e.Stats.KernelPackets, e.Stats.KernelDrops)
	}
	return b.String()
}
