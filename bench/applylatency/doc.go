// Package applylatency measures how long a large policy takes to be enforced on one node:
// from the start of the apply API call to the API's answer, and to the moment real packets
// show the new policy in force (the last rule's flow connects, a flow the old policy
// allowed and the new one does not is dropped), for policies of 100, 1,000 and 10,000
// rules, with an A/A control and optionally several builds of the agent measured in turns
// (see docs/benchmarks.md, "Apply to enforcement").
package applylatency
