package main

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rampartnet/rampart/examples/marketplace"
)

// probeTimeout bounds one connection attempt: a denied SYN is dropped, not refused, so a
// denied pair costs this much per round, plus the exec.
const probeTimeout = time.Second

// probes bounds the probes in flight: each is a kubectl exec, a process here and one in the
// pod, which a 2-core machine runs a few at a time.
const probes = 8

// probe connects from the source pod to the destination's podIP:8080 as a user checks a
// path: kubectl exec of agnhost connect in the source pod, whose exit status says whether
// it connected.
func probe(c *cluster, from, to pod) bool {
	cmd, cancel := c.command(probeTimeout+20*time.Second, "-n", marketplace.Namespace(from.Org), "exec", from.Name, "--",
		"/agnhost", "connect", net.JoinHostPort(to.IP, strconv.Itoa(marketplace.Port)), fmt.Sprintf("--timeout=%v", probeTimeout))
	defer cancel()
	return cmd.Run() == nil
}

// round probes every ordered pair of distinct pods at once.
func round(c *cluster, pods []pod) map[[2]int]bool {
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, probes)
	got := map[[2]int]bool{}
	for i := range pods {
		for j := range pods {
			if i == j {
				continue
			}
			wg.Go(func() {
				slots <- struct{}{}
				ok := probe(c, pods[i], pods[j])
				<-slots
				mu.Lock()
				got[[2]int{i, j}] = ok
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	return got
}

// check probes rounds until two in a row give the expected matrix (once could be a moment
// between two policies that happens to match) or the timeout passes, prints the last
// round, and reports whether it was the expected one.
func check(c *cluster, pods []pod, allowed map[[2]string]bool, timeout time.Duration) bool {
	want := func(i, j int) bool { return allowed[[2]string{pods[i].Org, pods[j].Org}] }
	matches := func(got map[[2]int]bool) bool {
		for k, v := range got {
			if v != want(k[0], k[1]) {
				return false
			}
		}
		return true
	}
	start := time.Now()
	var got map[[2]int]bool
	var enforced time.Duration
	inRow := 0
	for rounds := 1; ; rounds++ {
		got = round(c, pods)
		if matches(got) {
			if inRow == 0 {
				enforced = time.Since(start)
			}
			inRow++
		} else {
			inRow = 0
		}
		if inRow == 2 || time.Since(start) > timeout {
			break
		}
	}
	ok := inRow > 0
	printMatrix(pods, got, want)
	var same, cross, wrong int
	for k, v := range got {
		if pods[k[0]].Node == pods[k[1]].Node {
			same++
		} else {
			cross++
		}
		if v != want(k[0], k[1]) {
			wrong++
		}
	}
	if ok {
		fmt.Printf("all %d pairs as expected (%d same-node, %d cross-node), first in the round that ended %.1f s after the probes began (a round probes %d at a time, each up to %.1f s)\n",
			len(got), same, cross, enforced.Seconds(), probes, probeTimeout.Seconds())
		return true
	}
	fmt.Printf("%d of %d pairs differ from the expected table after %v:\n", wrong, len(got), timeout)
	for i := range pods {
		for j := range pods {
			if v, probed := got[[2]int{i, j}]; probed && v != want(i, j) {
				where := "cross-node"
				if pods[i].Node == pods[j].Node {
					where = "same-node"
				}
				fmt.Printf("  WRONG %s -> %s (%s, %s -> %s:8080): %s, expected %s\n", pods[i].Key(), pods[j].Key(), where,
					pods[i].Label(), pods[j].Label(), verdict(v), verdict(want(i, j)))
			}
		}
	}
	return false
}

func verdict(allowed bool) string {
	if allowed {
		return "allowed"
	}
	return "denied"
}

// printMatrix prints sources as rows and destinations as columns. A cell is "allow" or
// "deny" when the probe did what the table expects, "ALLOW!" or "DENY!" when it did not;
// cross-node cells are marked with '*'.
func printMatrix(pods []pod, got map[[2]int]bool, want func(i, j int) bool) {
	const w = 10
	fmt.Printf("%-*s", w+6, "from \\ to")
	for _, p := range pods {
		fmt.Printf("%-*s", w, p.Label())
	}
	fmt.Println()
	for i, p := range pods {
		fmt.Printf("%-*s", w+6, p.Label())
		for j, q := range pods {
			cell := "-"
			if i != j {
				v := got[[2]int{i, j}]
				cell = map[bool]string{true: "allow", false: "deny"}[v]
				if v != want(i, j) {
					cell = strings.ToUpper(cell) + "!"
				}
				if p.Node != q.Node {
					cell += "*"
				}
			}
			fmt.Printf("%-*s", w, cell)
		}
		fmt.Println()
	}
	fmt.Println("(* cross-node; ALLOW!/DENY!: differs from the expected table)")
}
