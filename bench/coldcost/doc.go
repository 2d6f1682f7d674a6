// Package coldcost measures what Rampart's tc programs cost a packet when the machine is
// idle between packets, as under the egress benchmark's ping at 1 ms: the programs run in
// place, on an endpoint's veth, and the kernel's own statistics (BPF_ENABLE_STATS: run
// time and run count per program) say how long each run took. At that rate every cache
// line a run touches is cold, which BPF_PROG_RUN loops (hot) do not show.
//
// Several rampartd builds can be compared in one run: they take turns on the same
// endpoint, round after round (A B C A B C ...), so drift on the machine falls on all of
// them alike; the summary is each build's median over the rounds. An empty TCX program
// ahead of Rampart's on the same hooks gives the floor: what the statistics themselves and
// the hook cost a run.
package coldcost
