// Package suggest writes network policy from observed flows: given the flows an agent saw
// and the endpoints it knows, it returns NetworkPolicy (and, where NetworkPolicy cannot say
// it, CiliumNetworkPolicy) manifests that admit exactly the observed traffic: per
// destination workload an ingress policy from the sources seen, per source workload an
// egress policy to the destinations seen, with the ports and protocols seen and, on
// request, the HTTP requests seen (as Cilium L7 rules).
//
// A workload is the set of endpoints of one namespace that have the same stable labels:
// their own labels less the keys that differ from pod to pod of one controller
// (PerPodKeys, such as pod-template-hash). Replicas are one workload, so a flow seen from
// one replica admits them all, as a person writing the policy by hand would. Selectors are
// the smallest subsets of the stable labels that select exactly the workloads seen in a
// role and no other endpoint of their namespace; when no such subset exists, each
// workload is selected on its own, and failing that each endpoint by all its labels.
//
// Flows the window shows as dropped are not admitted; Result.Dropped lists them, and the
// header of the output says so. The package is pure: it reads its input and formats text,
// with no kernel, agent or API import, so it is tested without root.
package suggest
