package agent

import (
	"errors"
	"sync"

	"github.com/rampartnet/rampart/internal/cidrtable"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/sockverdict"
)

// openKernel opens the kernel packages and wires them as the agent's Kernel: the tc
// dataplane, the CIDR set tables over its maps, the send-side verdict (loaded on first
// use) and the flow event reader.
func openKernel(cfg Config) (Kernel, error) {
	dp, err := datapath.Open(datapath.Config{PinDir: cfg.BPFDir, Attach: cfg.Attach})
	if err != nil {
		return Kernel{}, err
	}
	tables, err := cidrtable.Open(cidrtable.Maps(dp.CIDRMaps()), cfg.CIDRHostSlots)
	if err != nil {
		dp.Close()
		return Kernel{}, err
	}
	side, err := sockverdict.NewManager(dp.PinDir(), dp.SockPairsMap())
	if err != nil {
		tables.Close()
		dp.Close()
		return Kernel{}, err
	}
	// Open the reader now so that events emitted from here on are not lost to nobody.
	events, err := dp.Events()
	if err != nil {
		tables.Close()
		dp.Close()
		return Kernel{}, err
	}
	var once sync.Once
	var closeErr error
	return Kernel{
		EndpointTables: dp, IPCache: dp, ProxyRouting: dp, MapMemories: dp,
		CIDRSets: tables, SendSide: side, FlowEvents: flowEvents{events},
		Close: func() error {
			once.Do(func() {
				events.Close()
				tables.Close()
				// The send-side verdict's programs stay (pinned), like the tc programs.
				closeErr = errors.Join(side.Close(), dp.Close())
			})
			return closeErr
		},
	}, nil
}

// FindPins returns the paths of the dataplane's pins in the pin directory dir: the tc
// object's and those of the send-side verdict, which shares the directory.
func FindPins(dir string) ([]string, error) {
	sv, err := sockverdict.PinNames()
	if err != nil {
		return nil, err
	}
	return datapath.FindPins(dir, sv...)
}

// flowEvents reads the datapath's flow events as the agent's FlowEvent.
type flowEvents struct {
	r *datapath.EventReader
}

func (e flowEvents) EventsDrained() uint64 { return e.r.Drained() }

func (e flowEvents) ReadEvent() (FlowEvent, error) {
	ev, err := e.r.Read()
	if err != nil {
		return FlowEvent{}, err
	}
	return FlowEvent{
		Time:          ev.Time,
		Src:           ev.Source,
		Dst:           ev.Destination,
		SrcPort:       ev.SourcePort,
		DstPort:       ev.DestinationPort,
		EpID:          ev.EpID,
		SrcIdentity:   ev.SrcIdentity,
		DstIdentity:   ev.DstIdentity,
		RuleID:        ev.RuleID,
		MatchIdentity: ev.MatchIdentity,
		Ifindex:       ev.IfIndex,
		Length:        ev.Length,
		Type:          uint8(ev.Type),
		Verdict:       uint8(ev.Verdict),
		Reason:        uint8(ev.Reason),
		Direction:     uint8(ev.Direction),
		Protocol:      uint8(ev.Protocol),
		ICMPType:      ev.ICMPType,
		Flags:         flowFlags(ev),
	}, nil
}

func flowFlags(ev datapath.FlowEvent) uint8 {
	var f uint8
	if ev.L7Egress {
		f |= FlowFlagL7Egress
	}
	if ev.L7Ingress {
		f |= FlowFlagL7Ingress
	}
	if ev.FromProxy {
		f |= FlowFlagFromProxy
	}
	if ev.ARP {
		f |= FlowFlagARP
	}
	return f
}
