// Package starwars runs the Star Wars demo (scripts/demo-starwars.sh, manifests in
// examples/starwars) as an integration test: an agent in its own node namespace, the
// deathstar, two ships and two real FTP servers, no policy, then L3/L4 ingress, L3/L4
// egress and L7 policy, with every outcome asserted one by one. It needs root and
// pyftpdlib (scripts/setup.sh installs it); with CI=true it fails instead of skipping.
package starwars
