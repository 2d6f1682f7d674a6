// Package fqdn holds what DNS-aware policy needs and nothing of the kernel: the selectors
// of toFQDNs and rules.dns (matchName, matchPattern) and the cache of names learnt from
// the DNS answers the agent's DNS proxy allowed, each address with the time it may be used
// until (its TTL plus a grace). The agent turns the cache's addresses into policy peers;
// the proxy fills it. Addresses whose time has passed but that open connections still use
// stay as zombies, which no selector admits but whose identities the agent keeps.
package fqdn
