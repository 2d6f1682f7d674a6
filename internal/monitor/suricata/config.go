package suricata

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Mode is how Suricata meets the traffic it inspects.
type Mode int

const (
	// Passive reads the copies a mirror tap delivers to one interface (AF_PACKET). It
	// alerts; it cannot drop, since the original packets went their way already.
	Passive Mode = iota
	// IPS sits on a redirect tap's path: frames arriving on Interface leave on
	// PeerInterface and the other way round, unless a drop rule stops them (AF_PACKET
	// copy-mode ips). Nothing passes while Suricata is not running.
	IPS
	// NFQueue judges the packets netfilter queues to Queue (iptables -j NFQUEUE) in a
	// namespace that routes them; with no Suricata on the queue the kernel drops them.
	NFQueue
)

func (m Mode) String() string {
	switch m {
	case Passive:
		return "passive"
	case IPS:
		return "ips"
	case NFQueue:
		return "nfqueue"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Config describes one monitor.
type Config struct {
	Mode Mode
	// Netns is the path of the network namespace Suricata runs in (/run/netns/NAME); ""
	// runs it in the caller's.
	Netns string
	// Interface is the capture interface (Passive), or the interface facing the tapped
	// source (IPS).
	Interface string
	// PeerInterface is IPS's second interface, facing the destination. It must differ
	// from Interface: AF_PACKET IPS copies frames between two distinct interfaces.
	PeerInterface string
	// Queue is NFQueue's netfilter queue number.
	Queue uint16
	// Dir is the directory the monitor owns: its configuration, rules, logs, EVE file
	// and command socket. Start creates it.
	Dir string
	// Rules are rule lines (Suricata's rule language), written to Dir/rampart.rules.
	Rules []string
	// RuleFiles are further rule files, by absolute path.
	RuleFiles []string
	// HomeNet is $HOME_NET (CIDRs); empty means any. $EXTERNAL_NET is always any, so that
	// rules written for either direction match tapped flows.
	HomeNet []string
	// Threads is the number of capture (worker) threads per interface; 0 means 1. With
	// LuaRules it must stay 1 (see LuaRules).
	Threads int
	// LuaScripts are Lua scripts (absolute paths) copied into Dir, where Suricata looks up
	// the scripts that rules name (lua:NAME.lua; Dir is the default rule path).
	LuaScripts []string
	// LuaRules lets rules run Lua scripts (the lua keyword). Suricata 7 refuses such rules unless the
	// configuration allows them (security.lua.allow-rules). A script's global state
	// belongs to one worker thread, and cluster_flow gives each thread some of the flows:
	// a script that relates flows to one another (say the requests of one rental through
	// several services) sees them all only when one thread captures them all, so a
	// monitor with Lua rules runs one worker per interface. In IPS mode that is still one
	// thread for the tapped traffic: a redirect tap sends both directions of its flows in
	// through the receive interface, and nothing enters through the return one.
	LuaRules bool
	// Binary is the Suricata executable; "" looks up "suricata" on PATH.
	Binary string
	// StartTimeout bounds the wait for the engine to start; 0 means 30s.
	StartTimeout time.Duration
}

// AF_PACKET fanout groups are per network namespace: the ids only have to differ between
// the interfaces of one monitor (one monitor per namespace).
const (
	clusterPassive = 99
	clusterIn      = 98
	clusterOut     = 97
)

// Paths of the files a monitor keeps in its directory.
const (
	configName = "suricata.yaml"
	rulesName  = "rampart.rules"
	eveName    = "eve.json"
	logName    = "suricata.log"
	outputName = "output.log"
	socketName = "suricata.sock"
	pidName    = "suricata.pid"
	className  = "classification.config"
	refName    = "reference.config"
	threshName = "threshold.config"
	lockName   = "monitor.lock"
	// scriptsName lists, one a line, the Lua scripts Start copied into the directory, so
	// that RemoveDir tells them from files that are not the monitor's.
	scriptsName = "lua-scripts"
)

func (c *Config) validate() error {
	if c.Dir == "" || !filepath.IsAbs(c.Dir) {
		return fmt.Errorf("monitor directory %q: want an absolute path", c.Dir)
	}
	switch c.Mode {
	case Passive:
		if c.Interface == "" {
			return errors.New("passive mode needs an interface")
		}
	case IPS:
		if c.Interface == "" || c.PeerInterface == "" {
			return errors.New("ips mode needs two interfaces")
		}
		if c.Interface == c.PeerInterface {
			return fmt.Errorf("ips mode needs two distinct interfaces, got %s twice", c.Interface)
		}
	case NFQueue:
	default:
		return fmt.Errorf("unknown mode %v", c.Mode)
	}
	if c.LuaRules && c.Threads > 1 {
		return fmt.Errorf("%d threads with Lua rules: a Lua script's state is per thread, so a monitor with Lua rules runs one", c.Threads)
	}
	for _, f := range c.RuleFiles {
		if !filepath.IsAbs(f) {
			return fmt.Errorf("rule file %q: want an absolute path", f)
		}
	}
	for _, f := range c.LuaScripts {
		if !filepath.IsAbs(f) {
			return fmt.Errorf("lua script %q: want an absolute path", f)
		}
		if !c.LuaRules {
			return fmt.Errorf("lua script %s: Lua rules are not allowed (LuaRules)", f)
		}
		switch filepath.Base(f) {
		case configName, rulesName, eveName, logName, outputName, socketName, pidName, className, refName, threshName, lockName, scriptsName:
			return fmt.Errorf("lua script %s: its name is one of the monitor's own files", f)
		}
	}
	for _, r := range c.Rules {
		if strings.ContainsAny(r, "\n\r") {
			return fmt.Errorf("rule %q: one rule per line", r)
		}
	}
	return nil
}

func (c *Config) threads() int {
	if c.Threads <= 0 {
		return 1
	}
	return c.Threads
}

// The YAML document, in Suricata's key order. Every setting the monitor depends on is
// spelled out, so that a machine's /etc/suricata cannot change what a monitor does.
type yamlConfig struct {
	Vars              yamlVars      `yaml:"vars"`
	DefaultLogDir     string        `yaml:"default-log-dir"`
	DefaultRulePath   string        `yaml:"default-rule-path"`
	RuleFiles         []string      `yaml:"rule-files"`
	ClassFile         string        `yaml:"classification-file"`
	RefFile           string        `yaml:"reference-config-file"`
	ThresholdFile     string        `yaml:"threshold-file"`
	HostMode          string        `yaml:"host-mode"`
	Outputs           []yamlOutput  `yaml:"outputs"`
	Logging           yamlLogging   `yaml:"logging"`
	AFPacket          []yamlAFP     `yaml:"af-packet,omitempty"`
	NFQ               *yamlNFQ      `yaml:"nfq,omitempty"`
	AppLayer          yamlAppLayer  `yaml:"app-layer"`
	Stream            yamlStream    `yaml:"stream"`
	Capture           yamlCapture   `yaml:"capture"`
	UnixCommand       yamlUnix      `yaml:"unix-command"`
	FlowTimeouts      yamlFlowTOs   `yaml:"flow-timeouts"`
	MaxPendingPackets int           `yaml:"max-pending-packets"`
	Detect            yamlDetect    `yaml:"detect"`
	Stats             yamlEnabledIv `yaml:"stats"`
	Security          *yamlSecurity `yaml:"security,omitempty"`
	ExceptionPolicy   string        `yaml:"exception-policy"`
}

type yamlSecurity struct {
	Lua yamlLua `yaml:"lua"`
}

type yamlLua struct {
	AllowRules bool `yaml:"allow-rules"`
}

type yamlVars struct {
	AddressGroups map[string]string `yaml:"address-groups"`
	PortGroups    map[string]string `yaml:"port-groups"`
}

type yamlOutput struct {
	EVE yamlEVE `yaml:"eve-log"`
}

type yamlEVE struct {
	Enabled  bool   `yaml:"enabled"`
	Filetype string `yaml:"filetype"`
	Filename string `yaml:"filename"`
	Types    []any  `yaml:"types"`
}

type yamlLogging struct {
	DefaultLevel string           `yaml:"default-log-level"`
	Outputs      []map[string]any `yaml:"outputs"`
}

type yamlAFP struct {
	Interface   string `yaml:"interface"`
	Threads     int    `yaml:"threads"`
	ClusterID   int    `yaml:"cluster-id"`
	ClusterType string `yaml:"cluster-type"`
	Defrag      bool   `yaml:"defrag"`
	TPacketV3   bool   `yaml:"tpacket-v3"`
	CopyMode    string `yaml:"copy-mode,omitempty"`
	CopyIface   string `yaml:"copy-iface,omitempty"`
	UseMmap     bool   `yaml:"use-mmap"`
	// Packets from veths carry partial checksums: not checked (see Rendered).
	ChecksumChecks string `yaml:"checksum-checks"`
}

type yamlNFQ struct {
	Mode     string `yaml:"mode"`
	FailOpen bool   `yaml:"fail-open"`
}

type yamlAppLayer struct {
	Protocols map[string]yamlEnabled `yaml:"protocols"`
}

type yamlEnabled struct {
	Enabled bool `yaml:"enabled"`
}

type yamlEnabledIv struct {
	Enabled  bool `yaml:"enabled"`
	Interval int  `yaml:"interval"`
}

type yamlStream struct {
	ChecksumValidation bool   `yaml:"checksum-validation"`
	Inline             string `yaml:"inline"`
	Midstream          bool   `yaml:"midstream"`
}

type yamlCapture struct {
	DisableOffloading  bool   `yaml:"disable-offloading"`
	ChecksumValidation string `yaml:"checksum-validation"`
}

type yamlUnix struct {
	Enabled  bool   `yaml:"enabled"`
	Filename string `yaml:"filename"`
}

type yamlFlowTOs struct {
	Default yamlFlowTO `yaml:"default"`
	TCP     yamlFlowTO `yaml:"tcp"`
	UDP     yamlFlowTO `yaml:"udp"`
	ICMP    yamlFlowTO `yaml:"icmp"`
}

type yamlFlowTO struct {
	New                  int `yaml:"new"`
	Established          int `yaml:"established"`
	Closed               int `yaml:"closed"`
	Bypassed             int `yaml:"bypassed"`
	EmergencyNew         int `yaml:"emergency-new"`
	EmergencyEstablished int `yaml:"emergency-established"`
	EmergencyBypassed    int `yaml:"emergency-bypassed"`
}

type yamlDetect struct {
	Profile string `yaml:"profile"`
}

// Rendered returns the suricata.yaml for c (c.Dir holds every path it names).
func (c *Config) Rendered() ([]byte, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	path := func(name string) string { return filepath.Join(c.Dir, name) }
	home := "any"
	if len(c.HomeNet) > 0 {
		home = "[" + strings.Join(c.HomeNet, ",") + "]"
	}
	// Flows are reported (flow events) soon after they end, and a closed TCP flow is let
	// go at once: a tap's reader learns that Suricata is done with a flow from its flow
	// event, so these bound how long it waits.
	to := yamlFlowTO{New: 10, Established: 60, Bypassed: 10, EmergencyNew: 2, EmergencyEstablished: 10, EmergencyBypassed: 2}
	y := yamlConfig{
		Vars: yamlVars{
			AddressGroups: map[string]string{
				"HOME_NET": home, "EXTERNAL_NET": "any",
				"HTTP_SERVERS": "$HOME_NET", "SQL_SERVERS": "$HOME_NET", "DNS_SERVERS": "$HOME_NET",
			},
			PortGroups: map[string]string{
				"HTTP_PORTS": "80", "SHELLCODE_PORTS": "!80", "ORACLE_PORTS": "1521",
				"SSH_PORTS": "22", "FILE_DATA_PORTS": "[$HTTP_PORTS,110,143]",
			},
		},
		DefaultLogDir:   c.Dir,
		DefaultRulePath: c.Dir,
		RuleFiles:       append([]string{path(rulesName)}, c.RuleFiles...),
		ClassFile:       path(className),
		RefFile:         path(refName),
		ThresholdFile:   path(threshName),
		HostMode:        "sniffer-only",
		Outputs: []yamlOutput{{EVE: yamlEVE{
			Enabled: true, Filetype: "regular", Filename: path(eveName),
			Types: []any{
				map[string]any{"alert": map[string]any{"tagged-packets": false}},
				"drop",
				"flow",
				map[string]any{"http": map[string]any{"extended": true}},
				"pgsql",
				// Suricata's counters merged over its threads, as totals since its start, at
				// every stats interval: `monitor run` reports what they say of the capture
				// (packets taken, packets the kernel dropped for want of room in the ring).
				// A record holds every counter, zeros included: about 8 KB a second.
				map[string]any{"stats": map[string]any{"totals": true, "threads": false, "deltas": false}},
			},
		}}},
		Logging: yamlLogging{
			DefaultLevel: "info",
			Outputs: []map[string]any{
				{"console": map[string]any{"enabled": false}},
				{"file": map[string]any{"enabled": true, "level": "info", "filename": path(logName)}},
				{"syslog": map[string]any{"enabled": false}},
			},
		},
		AppLayer: yamlAppLayer{Protocols: map[string]yamlEnabled{
			"http":  {Enabled: true},
			"pgsql": {Enabled: true}, // off by default in Suricata 7
		}},
		// Checksums are not checked: packets from veths carry partial checksums that the
		// kernel completes only on the way out of the machine.
		Stream: yamlStream{ChecksumValidation: false, Inline: "auto", Midstream: true},
		// Suricata 7's exception policies default, inline, to dropping a flow whose
		// stream or application protocol it cannot follow: a connection a tap starts to
		// redirect after it opened (picked up midstream, its parser lost) would be cut.
		// What passes is the rules' decision, not the engine's.
		ExceptionPolicy: "ignore",
		// Suricata switches off its capture interfaces' receive offloads (GRO, LRO), which
		// would merge packets into ones larger than its capture frames, and restores them
		// on exit.
		Capture:           yamlCapture{DisableOffloading: true, ChecksumValidation: "none"},
		UnixCommand:       yamlUnix{Enabled: true, Filename: path(socketName)},
		FlowTimeouts:      yamlFlowTOs{Default: to, TCP: to, UDP: to, ICMP: to},
		MaxPendingPackets: 1024,
		Detect:            yamlDetect{Profile: "low"},
		Stats:             yamlEnabledIv{Enabled: true, Interval: 1},
	}
	if c.LuaRules {
		y.Security = &yamlSecurity{Lua: yamlLua{AllowRules: true}}
	}
	switch c.Mode {
	case Passive:
		// A passive monitor inspects the stream as packets arrive (stream.inline) rather
		// than when the receiver's acknowledgement or the flow's end comes: an alert then
		// follows its packet at once, instead of after the flow times out.
		y.Stream.Inline = "yes"
		y.AFPacket = []yamlAFP{{
			Interface: c.Interface, Threads: c.threads(), ClusterID: clusterPassive,
			ClusterType: "cluster_flow", Defrag: true, TPacketV3: true, UseMmap: true,
			ChecksumChecks: "no",
		}}
	case IPS:
		y.HostMode = "router"
		// Inline, IP fragments are passed on as they came: defragmenting would change
		// what the destination receives.
		y.AFPacket = []yamlAFP{
			{Interface: c.Interface, Threads: c.threads(), ClusterID: clusterIn, ClusterType: "cluster_flow",
				CopyMode: "ips", CopyIface: c.PeerInterface, UseMmap: true, ChecksumChecks: "no"},
			{Interface: c.PeerInterface, Threads: c.threads(), ClusterID: clusterOut, ClusterType: "cluster_flow",
				CopyMode: "ips", CopyIface: c.Interface, UseMmap: true, ChecksumChecks: "no"},
		}
	case NFQueue:
		y.HostMode = "router"
		// fail-open would let packets through unjudged when Suricata falls behind: a
		// redirect tap fails closed.
		y.NFQ = &yamlNFQ{Mode: "accept", FailOpen: false}
	}
	body, err := yaml.Marshal(&y)
	if err != nil {
		return nil, fmt.Errorf("encoding suricata.yaml: %w", err)
	}
	return append([]byte("%YAML 1.1\n---\n"), body...), nil
}

// args are Suricata's command-line arguments for c.
func (c *Config) args() []string {
	// --init-errors-fatal: a rule that does not load stops the start. Suricata would
	// otherwise run without it, and for a drop rule that means letting through what the
	// monitor is there to stop.
	a := []string{"-c", filepath.Join(c.Dir, configName), "-l", c.Dir,
		"--pidfile", filepath.Join(c.Dir, pidName), "-k", "none", "--runmode", "workers",
		"--init-errors-fatal"}
	switch c.Mode {
	case Passive, IPS:
		a = append(a, "--af-packet")
	case NFQueue:
		a = append(a, "-q", fmt.Sprint(c.Queue))
	}
	return a
}
