// Package join joins a monitor's EVE alerts and drops (internal/monitor/suricata) to
// Rampart's view of the flow they are about, as the agent's API gives it: the flow's two
// sides with their endpoints (or node, world and CIDR identities) and security identities,
// Rampart's own flow event of the connection (when it was tapped, and the verdict), and
// the tap contracts of that monitor that tap it, decided by tap.Match.Matches. It is
// pure: the caller reads the API and the EVE file.
package join
