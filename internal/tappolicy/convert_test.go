package tappolicy

import (
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/tap"
)

// The port is the server side's: the endpoint's own for ingress, the peer's for egress,
// and both split in two; a contract with a port takes both directions of the connections.
func TestTapContractsPortSides(t *testing.T) {
	base := Contract{Name: "tp-0123456789", Source: "dvd/db", Monitor: "dvd/ids-1", Protocol: "TCP", Action: "redirect"}
	for _, tc := range []struct {
		dir  string
		port uint16
		want []string // name and match
	}{
		{"ingress", 5432, []string{"tp-0123456789 both TCP ports 5432"}},
		{"egress", 5432, []string{"tp-0123456789 both TCP peer-ports 5432"}},
		{"both", 5432, []string{"tp-0123456789-in both TCP ports 5432", "tp-0123456789-out both TCP ports 1-5431,5433-65535 peer-ports 5432"}},
		{"both", 1, []string{"tp-0123456789-in both TCP ports 1", "tp-0123456789-out both TCP ports 2-65535 peer-ports 1"}},
		{"both", 0, []string{"tp-0123456789 both TCP"}},
		{"ingress", 0, []string{"tp-0123456789 ingress TCP"}},
	} {
		k := base
		k.Direction, k.Port = tc.dir, tc.port
		cs, err := k.TapContracts("taps.mg")
		if err != nil {
			t.Fatalf("%s/%d: %v", tc.dir, tc.port, err)
		}
		var got []string
		for _, c := range cs {
			got = append(got, c.Name+" "+c.Match.String())
			if c.Kind != tap.KindTapContract || c.Origin != "tap policy taps.mg" || c.FailMode != tap.FailClosed ||
				c.Action != tap.Redirect || c.Source.Endpoint != "dvd/db" || c.Monitor != "dvd/ids-1" {
				t.Errorf("%s/%d: contract %+v", tc.dir, tc.port, c)
			}
		}
		if strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("%s/%d: got %q, want %q", tc.dir, tc.port, got, tc.want)
		}
		// The two halves of "both" never overlap each other.
		if len(cs) == 2 && tap.Overlaps(cs[0].Match, cs[1].Match) {
			t.Errorf("%s/%d: the halves overlap", tc.dir, tc.port)
		}
	}
}

// Contracts from a whole compilation convert, and what tap.Validate refuses is refused.
func TestTapContractsFromResult(t *testing.T) {
	res := compile(t, rentalPolicy, rental())
	cs, err := res.TapContracts("taps.mg")
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != len(res.Contracts) {
		t.Fatalf("%d tap contracts from %d compiled", len(cs), len(res.Contracts))
	}
	bad := Contract{Name: "tp-0123456789", Source: "dvd/ids-1", Monitor: "dvd/ids-1", Direction: "ingress", Protocol: "TCP", Action: "mirror"}
	if _, err := bad.TapContracts("taps.mg"); err == nil || !strings.Contains(err.Error(), "cannot tap itself") {
		t.Errorf("a monitor tapping itself: %v", err)
	}
	bad = Contract{Name: "tp-0123456789", Source: "dvd/db", Monitor: "dvd/ids-1", Direction: "sideways", Protocol: "TCP", Action: "mirror"}
	if _, err := bad.TapContracts("taps.mg"); err == nil || !strings.Contains(err.Error(), "sideways") {
		t.Errorf("a bad direction: %v", err)
	}
}

func TestFactsAtoms(t *testing.T) {
	atoms, err := rental().Atoms()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`endpoint("dvd/db","dvd","n1").`, `port("dvd/db","TCP",5432).`, `exposed("dvd/user-update").`,
		`inspects("dvd/ids-1","pgsql").`, `monitor_load("dvd/ids-2",0).`, `node("n2",20).`, `talks("dvd/user-update","dvd/db","TCP",5432).`} {
		if !contains(atoms, want) {
			t.Errorf("facts lack %s: %v", want, atoms)
		}
	}
	if atoms[0] != `endpoint("dvd/contract-update","dvd","n1").` {
		t.Errorf("first fact %s, want the endpoints first, sorted", atoms[0])
	}
}

// A wildcard premise is shown as "_", not as an empty argument.
func TestExplainWildcard(t *testing.T) {
	res := compile(t, `tap(S, M, "ingress", "TCP", 5432, "mirror") :- label(S, "app", "db"), monitor(M, _), inspects(M, "http").`, rental())
	if len(res.Contracts) != 1 || !contains(res.Contracts[0].Why[0].Facts, `monitor("dvd/ids-1",_)`) {
		t.Fatalf("contracts %+v", res.Contracts)
	}
}
