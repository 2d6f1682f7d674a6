package datapath

import (
	"fmt"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// Conntrack times are in jiffies: the kernel's tick counter, which the programs read with
// bpf_jiffies64 (inlined by the verifier: one load). The tick's length (1/HZ) is a kernel
// build option, so the agent learns it from the running kernel: it is the resolution of
// CLOCK_MONOTONIC_COARSE, which advances once a tick.

// kernelTick returns the length of the kernel's tick.
func kernelTick() (time.Duration, error) {
	var res unix.Timespec
	if err := unix.ClockGetres(unix.CLOCK_MONOTONIC_COARSE, &res); err != nil {
		return 0, fmt.Errorf("reading the kernel's tick (coarse clock resolution): %w", err)
	}
	tick := time.Duration(res.Nano())
	// CONFIG_HZ is 100, 250, 300 or 1000 on common architectures, and 24 to 1200 on any.
	// Outside that the resolution is not the tick, and timeouts counted in it would be
	// wrong (too long, if it were finer): refuse rather than guess.
	if tick < 800*time.Microsecond || tick > 42*time.Millisecond {
		return 0, fmt.Errorf("kernel tick %v (coarse clock resolution): not a tick of HZ 24 to 1200", tick)
	}
	return tick, nil
}

// toJiffies converts a duration to whole ticks (rounded down: a timeout of less than a
// tick expires at the next tick).
func toJiffies(d, tick time.Duration) uint64 {
	return uint64(d / tick)
}

// jiffiesNow reads the kernel's tick counter, as the programs see it, by running a small
// program that stores bpf_jiffies64() in a one-entry array.
func jiffiesNow() (uint64, error) {
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		return 0, fmt.Errorf("reading jiffies: %w", err)
	}
	defer m.Close()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:    ebpf.SocketFilter,
		License: "GPL",
		Instructions: asm.Instructions{
			asm.FnJiffies64.Call(),
			asm.Mov.Reg(asm.R6, asm.R0),
			asm.StoreImm(asm.RFP, -4, 0, asm.Word),
			asm.LoadMapPtr(asm.R1, m.FD()),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "out"),
			asm.StoreMem(asm.R0, 0, asm.R6, asm.DWord),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("out"),
			asm.Return(),
		},
	})
	if err != nil {
		return 0, fmt.Errorf("reading jiffies: %w", err)
	}
	defer p.Close()
	if _, err := p.Run(&ebpf.RunOptions{Data: make([]byte, 14)}); err != nil {
		return 0, fmt.Errorf("reading jiffies: %w", err)
	}
	var j uint64
	if err := m.Lookup(uint32(0), &j); err != nil {
		return 0, fmt.Errorf("reading jiffies: %w", err)
	}
	return j, nil
}

// nsToJiffies converts times of the monotonic clock in nanoseconds (conntrack entries of
// earlier versions) to jiffies, from one reading of both clocks.
type nsToJiffies struct {
	nowNs, nowJ uint64
	tick        time.Duration
}

func newNsToJiffies(tick time.Duration) (nsToJiffies, error) {
	j, err := jiffiesNow()
	if err != nil {
		return nsToJiffies{}, err
	}
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nsToJiffies{}, fmt.Errorf("reading the monotonic clock: %w", err)
	}
	return nsToJiffies{nowNs: uint64(ts.Nano()), nowJ: j, tick: tick}, nil
}

// jiffies returns the tick at monotonic time ns: the same age before now.
func (c nsToJiffies) jiffies(ns uint64) uint64 {
	if ns >= c.nowNs {
		return c.nowJ
	}
	age := (c.nowNs - ns) / uint64(c.tick)
	if age > c.nowJ {
		return 0
	}
	return c.nowJ - age
}
