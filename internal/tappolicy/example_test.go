package tappolicy

import (
	"fmt"
	"os"
	"reflect"
	"testing"
)

// The DVD rental store's tap policy (examples/dvdrental/taps.mg) compiles over the
// store's facts (Fig. 1b, its connection policy) to the contracts docs/taps.md shows.
func TestDVDRentalExample(t *testing.T) {
	src, err := os.ReadFile("../../examples/dvdrental/taps.mg")
	if err != nil {
		t.Fatal(err)
	}
	svc := func(name string, exposed bool, port uint16) Endpoint {
		e := Endpoint{Namespace: "dvd", Name: name, Node: "n1", Labels: map[string]string{"app": name}, Exposed: exposed}
		if port != 0 {
			e.Ports = []Port{{"TCP", port}}
		}
		return e
	}
	mon := func(name, what string) Endpoint {
		return Endpoint{Namespace: "dvd", Name: name, Node: "n1", Monitor: &Monitor{Inspects: []string{what}}}
	}
	talk := func(from, to string, port uint16) Talk {
		return Talk{From: "dvd/" + from, To: "dvd/" + to, Protocol: "TCP", Port: port}
	}
	f := Facts{
		Endpoints: []Endpoint{
			svc("contract-update", true, 8080), svc("user-update", false, 8080), svc("user-create", false, 8080),
			svc("dvd-update", false, 8080), svc("shipping", false, 8080), svc("dvd-return", false, 0),
			svc("mq", false, 1883), svc("db", false, 5432),
			mon("ids-pg", "pgsql"), mon("ids-mq", "mqtt"), mon("ids-http", "http"),
		},
		Nodes: []Node{{"n1", 11}},
		Talks: []Talk{
			talk("contract-update", "user-update", 8080), talk("contract-update", "mq", 1883),
			talk("dvd-update", "mq", 1883), talk("dvd-return", "mq", 1883), talk("dvd-update", "shipping", 8080),
			talk("user-update", "db", 5432), talk("user-create", "db", 5432), talk("dvd-update", "db", 5432),
		},
	}
	res, err := Compile("taps.mg", src, f)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, k := range res.Contracts {
		got = append(got, fmt.Sprintf("%s %s %s %s/%d -> %s", k.Action, k.Source, k.Direction, k.Protocol, k.Port, k.Monitor))
	}
	want := []string{
		"mirror dvd/contract-update egress TCP/1883 -> dvd/ids-mq",
		"mirror dvd/contract-update ingress TCP/8080 -> dvd/ids-http",
		"redirect dvd/db ingress TCP/5432 -> dvd/ids-pg",
	}
	if !reflect.DeepEqual(got, want) || len(res.Unplaced) != 0 {
		t.Errorf("contracts:\n%v\nwant:\n%v\nunplaced %+v", got, want, res.Unplaced)
	}
	if _, err := res.TapContracts("taps.mg"); err != nil {
		t.Error(err)
	}
}
