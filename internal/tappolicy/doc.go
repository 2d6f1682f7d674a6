// Package tappolicy compiles a tap policy written in Datalog (google/mangle) into tap
// contracts, after the security-as-a-service paper (seeds/002, section III): the user states
// which flows of which endpoints a monitor must see, over facts Rampart derives from its
// model (endpoints, labels, namespaces, ports, which endpoints are reachable from outside,
// who may talk to whom, monitors and what they inspect, node and monitor load), and the
// compiler derives the contracts and places the monitors.
//
// A policy derives either contracts directly, tap(Source, Monitor, Direction, Protocol,
// Port, Action), or inspection requests, inspect(Source, What, Direction, Protocol, Port,
// Action), which a placement strategy turns into contracts: a monitor per application, or a
// monitor per node with sources sliced across that node's monitors by load (section III-C).
// Every contract carries its explanation: the rules that derived it, each with the facts
// its premises matched (a provenance rule is added beside each rule of the policy), and for
// a placed request why that monitor was chosen.
//
// The package is pure: it reads facts and source text and returns contracts; the agent
// feeds it its model and hands the contracts to the tap layer, which checks them for
// overlap like any other contract. Evaluation is bounded by a limit on derived facts, so no
// policy can make the agent allocate without bound.
package tappolicy
