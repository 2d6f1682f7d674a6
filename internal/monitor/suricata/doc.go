// Package suricata runs Suricata 7 as a flow tap's security monitor: it writes a complete
// configuration of its own for one monitor (no reliance on /etc/suricata), starts Suricata
// inside a monitor's network namespace in one of three modes, waits until its engine runs,
// stops it, and reads its EVE JSON events (alert, drop, flow, http, pgsql) as typed values
// with the flow's 5-tuple.
//
// The modes match the tap actions: Passive reads the copies of a mirror tap from one
// interface (AF_PACKET); IPS sits on a redirect tap's path between two interfaces and
// copies every frame it does not drop from one to the other (AF_PACKET copy-mode ips);
// NFQueue judges packets that netfilter queues to it in a routing namespace.
//
// The package sits in the kernel edge: it runs a process in a network namespace. It knows
// nothing of tap contracts or the agent; the agent joins the events it reads to flows.
package suricata
