// Package taps tests flow taps end to end: an agent, endpoints with real traffic, tap
// contracts through the CLI, and a real Suricata in the monitor endpoint, passive on the
// mirror's copies and inline (AF_PACKET IPS) on a redirect.
package taps
