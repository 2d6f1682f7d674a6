package cluster

import (
	"fmt"
	"strings"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

func f3(f benchkit.Float) string {
	if !f.Valid() {
		return "-"
	}
	return fmt.Sprintf("%.3f", float64(f))
}

func gbps(f benchkit.Float) string {
	if !f.Valid() {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(f)/1e9)
}

func f1(f benchkit.Float) string {
	if !f.Valid() {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(f))
}

// Table renders the report as markdown: one table per experiment, the modes, and the
// paper's figures.
func Table(rep *Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Cluster benchmark %s\n\n", rep.Started.Format("2006-01-02 15:04:05Z"))
	fmt.Fprintf(&b, "%d CPUs, Linux %s, %s, load average %.2f at start, %.2f at end", rep.Host.CPUs, rep.Host.Kernel, rep.Host.Iperf3, rep.Host.LoadStart, rep.Host.LoadEnd)
	if rep.Settings.Quick {
		b.WriteString(", quick mode")
	}
	b.WriteString(".\n\n")
	switch rep.Settings.Control {
	case ControlNodes:
		b.WriteString("Clusters of real nodes: kubelet, containerd and kube-proxy per node, kube-scheduler and kube-controller-manager, rampartd in Kubernetes mode as the CNI; pods are Pod objects (agnhost), policies NetworkPolicy objects written to the API.\n\n")
	case ControlK8s:
		b.WriteString("Clusters on a kube-apiserver and etcd: rampartd --kubeconfig and a pod runner per node; pods are Pod objects, policies NetworkPolicy objects written to the API.\n\n")
	default:
		b.WriteString("Clusters without a control plane: nodes, pods and policies declared through each agent's API.\n\n")
	}
	b.WriteString("| tunnel mode | available | pod MTU |\n|---|---|---:|\n")
	for _, m := range rep.Modes {
		avail := "yes"
		if !m.Available {
			avail = "not available: " + m.Reason
		}
		fmt.Fprintf(&b, "| %s | %s | %d |\n", m.Name, avail, m.PodMTU)
	}
	if p := rep.Pods; p != nil {
		offered := "as fast as each sender can"
		if rep.Settings.UDPBps > 0 {
			offered = fmt.Sprintf("%.2f Gbit/s offered by all pairs together", rep.Settings.UDPBps/1e9)
		}
		fmt.Fprintf(&b, "\n## Pod scalability\n\nAll pairs at once, %d s, %d round(s); aggregate of the receivers' rates; ratio to 1 pair of the same round; UDP %s; target at %d pairs >= %.2f.\n\n",
			rep.Settings.PodSeconds, rep.Settings.PodRepeats, offered, maxInt(rep.Settings.Pairs), TargetPodRatio)
		b.WriteString("| mode | traffic | policy | pairs | Gbit/s | ratio to 1 pair | slowest pair Gbit/s | fastest pair Gbit/s | UDP loss % | CPUs busy % | verdict |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n")
		for _, s := range p.Summary {
			pol := "allow"
			if !s.Policy {
				pol = "none"
			}
			loss := "-"
			if strings.HasPrefix(s.Traffic, "udp") {
				loss = f1(s.LossPercent)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", s.Mode, s.Traffic, pol, s.Pairs,
				gbps(s.Bps), f3(s.Ratio), gbps(s.MinPairBps), gbps(s.MaxPairBps), loss, f1(s.CPUBusy), s.Verdict)
		}
		for _, e := range p.Errors {
			fmt.Fprintf(&b, "\nerror: %s\n", e)
		}
	}
	if o := rep.Overlay; o != nil {
		fmt.Fprintf(&b, "\n## Overlay cost\n\nOne pair, TCP iperf3 %d s and 1-byte request/response %.1f s per sample, %d round(s); ratios are medians of each round's ratios.\n\n",
			rep.Settings.Seconds, rep.Settings.RRSeconds, rep.Settings.Repeats)
		b.WriteString("| path | pod MTU | Gbit/s | vs native | vs fabric | TPS | TPS vs native | TPS vs fabric | p50 us | p50 vs native | p99 us |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, c := range o.Cases {
			if !c.Available {
				fmt.Fprintf(&b, "| %s | - | not available: %s |||||||||\n", c.Name, c.Reason)
				continue
			}
			s := c.Summary
			fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", c.Name, c.PodMTU, gbps(s.Bps),
				f3(s.VsNativeBps), f3(s.VsFabricBps), f1(s.TPS), f3(s.VsNativeTPS), f3(s.VsFabricTPS), f1(s.P50Us), f3(s.VsNativeP50), f1(s.P99Us))
		}
		for _, c := range o.Cases {
			for _, e := range c.Errors {
				fmt.Fprintf(&b, "\nerror: %s: %s\n", c.Name, e)
			}
		}
	}
	if p := rep.Policies; p != nil {
		fmt.Fprintf(&b, "\n## Policy scalability across nodes (tunnel %s)\n\nPolicies on node B selecting the server, the matching one last; each case paired with a no-policy sample; target >= %.2f.\n\n",
			p.Mode, TargetPolicyRatio)
		b.WriteString("| case | map entries | Gbit/s | ratio (min-max) | TPS | TPS ratio | p50 us | p50 ratio | enforced s | verdict |\n|---|---:|---:|---|---:|---:|---:|---:|---:|---|\n")
		for _, c := range p.Cases {
			s := c.Summary
			fmt.Fprintf(&b, "| %s | %d | %s | %s (%s-%s) | %s | %s | %s | %s | %s | %s |\n", c.Name, s.MapEntries, gbps(s.Bps),
				f3(s.Ratio), f3(s.RatioMin), f3(s.RatioMax), f1(s.TPS), f3(s.TPSRatio), f1(s.P50Us), f3(s.P50Ratio), f3(s.EnforcedSecs), s.Verdict)
		}
		for _, c := range p.Cases {
			for _, e := range c.Errors {
				fmt.Fprintf(&b, "\nerror: %s: %s\n", c.Name, e)
			}
		}
	}
	b.WriteString("\n## Published (seeds/001)\n\n| experiment | system | where | figure |\n|---|---|---|---|\n")
	for _, p := range rep.Published {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", p.Experiment, p.System, p.Figure, p.Value)
	}
	for _, e := range rep.Errors {
		fmt.Fprintf(&b, "\nerror: %s\n", e)
	}
	return b.String()
}

func maxInt(xs []int) int {
	m := 0
	for _, x := range xs {
		m = max(m, x)
	}
	return m
}
