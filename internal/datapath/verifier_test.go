package datapath

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/testenv"
)

// verifierBudget is how much of the kernel's 1M instruction verification limit a program
// may take: what the next feature adds must not be what tips a program over.
const verifierBudget = 900_000

var processed = regexp.MustCompile(`processed (\d+) insns`)

// TestVerifierHeadroom loads each program of the object on its own and checks the
// verifier's work on it against verifierBudget (the tc endpoint programs carry policy,
// conntrack, taps and the CIDR sets' global subprogram), and those of the Service
// translation's object.
func TestVerifierHeadroom(t *testing.T) {
	testenv.RequireRoot(t)
	for _, load := range []func() (*ebpf.CollectionSpec, error){loadRampart, loadService} {
		spec, err := load()
		if err != nil {
			t.Fatal(err)
		}
		verifierHeadroom(t, spec)
	}
}

func verifierHeadroom(t *testing.T, spec *ebpf.CollectionSpec) {
	for name := range spec.Programs {
		s := spec.Copy()
		for _, m := range s.Maps {
			m.Pinning = ebpf.PinNone
			if m.Type == ebpf.ProgramArray {
				m.Contents = nil // the other programs are not loaded
			}
		}
		for n := range s.Programs {
			if n != name {
				delete(s.Programs, n)
			}
		}
		coll, err := ebpf.NewCollectionWithOptions(s, ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}})
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		m := processed.FindStringSubmatch(coll.Programs[name].VerifierLog)
		coll.Close()
		if m == nil {
			t.Errorf("%s: no instruction count in the verifier's log", name)
			continue
		}
		n, _ := strconv.Atoi(m[1])
		t.Logf("%s: %d instructions verified", name, n)
		if n > verifierBudget {
			t.Errorf("%s: the verifier processed %d instructions, more than the budget of %d (limit 1,000,000)", name, n, verifierBudget)
		}
	}
}
