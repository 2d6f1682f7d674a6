package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv"
)

var bins = testenv.Binaries{Packages: []string{"./cmd/rampart-cni"}}

func TestMain(m *testing.M) { bins.Main(m) }

func TestParseConf(t *testing.T) {
	for _, tc := range []struct {
		conf       string
		socket     string
		code       uint
		detailPart string
	}{
		{`{"cniVersion":"1.1.0","name":"n","type":"rampart-cni"}`, "/run/rampart/default.sock", 0, ""},
		{`{"cniVersion":"1.0.0","name":"n","type":"rampart-cni","instance":"node1"}`, "/run/rampart/node1.sock", 0, ""},
		{`{"cniVersion":"1.1.0","name":"n","type":"rampart-cni","socket":"/tmp/x.sock"}`, "/tmp/x.sock", 0, ""},
		// Fields the runtime adds are not the plugin's business.
		{`{"cniVersion":"1.1.0","name":"n","type":"rampart-cni","runtimeConfig":{},"cni.dev/valid-attachments":[]}`, "/run/rampart/default.sock", 0, ""},
		{`{"cniVersion":"1.1.0","name":"n","type":"rampart-cni","socket":"/tmp/x.sock","instance":"a"}`, "", types.ErrInvalidNetworkConfig, "not both"},
		{`{"cniVersion":"1.1.0","name":"n","type":"rampart-cni","socket":"x.sock"}`, "", types.ErrInvalidNetworkConfig, `socket "x.sock": want an absolute path`},
		{`{"cniVersion":"1.1.0","name":"n","type":"rampart-cni","instance":"../x"}`, "", types.ErrInvalidNetworkConfig, "instance:"},
		{`{"cniVersion":"0.4.0","name":"n","type":"rampart-cni"}`, "", types.ErrIncompatibleCNIVersion, `cniVersion "0.4.0"`},
		{`{"cniVersion":"1.1.0","name":"n","type":"rampart-cni","socket":7}`, "", types.ErrDecodingFailure, "socket"},
		{`{`, "", types.ErrDecodingFailure, ""},
	} {
		_, socket, terr := parseConf([]byte(tc.conf))
		if tc.code == 0 {
			if terr != nil || socket != tc.socket {
				t.Errorf("%s: socket %q, error %v; want %q", tc.conf, socket, terr, tc.socket)
			}
			continue
		}
		if terr == nil || terr.Code != tc.code || !strings.Contains(terr.Details, tc.detailPart) {
			t.Errorf("%s: error %+v, want code %d with %q", tc.conf, terr, tc.code, tc.detailPart)
		}
	}
}

func TestPodArgs(t *testing.T) {
	ns, name, terr := podArgs("IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME=web-1;K8S_POD_INFRA_CONTAINER_ID=abc")
	if terr != nil || ns != "shop" || name != "web-1" {
		t.Fatalf("podArgs = %q %q %v", ns, name, terr)
	}
	if ns, name, terr := podArgs(""); terr != nil || ns != "" || name != "" {
		t.Fatalf("podArgs of nothing = %q %q %v", ns, name, terr)
	}
	if _, _, terr := podArgs("K8S_POD_NAME=a;garbage"); terr == nil || terr.Code != types.ErrInvalidEnvironmentVariables || !strings.Contains(terr.Details, `"garbage"`) {
		t.Fatalf("podArgs of garbage: %+v", terr)
	}
}

func TestAgentErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code uint
	}{
		{errors.New("dial unix /x: connect: no such file or directory"), types.ErrTryAgainLater},
		{api.BadRequest("interface name"), types.ErrInvalidEnvironmentVariables},
		{api.NotFound("no endpoint"), types.ErrUnknownContainer},
		{api.Conflict("already has endpoint"), errAgentRefused},
		{api.Errorf(http.StatusServiceUnavailable, "busy"), types.ErrTryAgainLater},
		{errors.New("x"), types.ErrTryAgainLater},
		{api.Errorf(http.StatusInternalServerError, "boom"), types.ErrInternal},
	} {
		got := agentError("/s", "ADD", tc.err)
		if got.Code != tc.code {
			t.Errorf("%v: code %d, want %d", tc.err, got.Code, tc.code)
		}
		if !strings.Contains(got.Msg+got.Details, "ADD") {
			t.Errorf("%v: %+v does not name the command", tc.err, got)
		}
	}
}

func TestResultFormat(t *testing.T) {
	res, err := cniResult("1.1.0", api.CNIResult{
		Namespace: "shop", Name: "web", ContainerID: "c1", Netns: "/run/netns/sb", IfName: "eth0", MAC: "02:00:00:00:00:01",
		HostInterface: "rp12345678", HostMAC: "02:00:00:00:00:02", IP: "198.18.0.3/32", Gateway: "198.18.0.1", Routes: []string{"0.0.0.0/0"},
	})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := res.PrintTo(&buf); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := `{"cniVersion":"1.1.0","interfaces":[{"mac":"02:00:00:00:00:02","name":"rp12345678"},{"mac":"02:00:00:00:00:01","name":"eth0","sandbox":"/run/netns/sb"}],"ips":[{"address":"198.18.0.3/32","gateway":"198.18.0.1","interface":1}],"routes":[{"dst":"0.0.0.0/0","gw":"198.18.0.1"}]}`
	var w map[string]any
	json.Unmarshal([]byte(want), &w)
	gb, _ := json.Marshal(got)
	wb, _ := json.Marshal(w)
	if string(gb) != string(wb) {
		t.Fatalf("result\n%s\nwant\n%s", gb, wb)
	}
	if _, err := cniResult("1.1.0", api.CNIResult{IP: "nonsense", Gateway: "198.18.0.1"}); err == nil {
		t.Fatal("a bad address made a result")
	}
}

// A dual-stack endpoint's result has both addresses, each with its gateway (the IPv6 one
// the host veth's link-local address), and a default route of each family through the
// gateway of that family.
func TestResultFormatDualStack(t *testing.T) {
	r := api.CNIResult{
		Namespace: "shop", Name: "web", ContainerID: "c1", Netns: "/run/netns/sb", IfName: "eth0", MAC: "02:00:00:00:00:01",
		HostInterface: "rp12345678", HostMAC: "02:00:00:00:00:02", IP: "198.18.0.3/32", Gateway: "198.18.0.1",
		IP6: "2001:2::3/128", Gateway6: "fe80::1", Routes: []string{"0.0.0.0/0", "::/0"},
	}
	res, err := cniResult("1.1.0", r)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := res.PrintTo(&buf); err != nil {
		t.Fatal(err)
	}
	var got struct {
		IPs []struct {
			Address, Gateway string
			Interface        int
		}
		Routes []struct{ Dst, GW string }
	}
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	gotS := fmt.Sprint(got.IPs, got.Routes)
	want := "[{198.18.0.3/32 198.18.0.1 1} {2001:2::3/128 fe80::1 1}] [{0.0.0.0/0 198.18.0.1} {::/0 fe80::1}]"
	if gotS != want {
		t.Fatalf("result %s\nwant %s\n(%s)", gotS, want, buf.String())
	}
	r.Gateway6 = "198.18.0.1"
	if _, err := cniResult("1.1.0", r); err == nil || !strings.Contains(err.Error(), "another address family") {
		t.Fatalf("an IPv4 gateway for the IPv6 address: %v", err)
	}
	r.IP6, r.Gateway6 = "", ""
	if _, err := cniResult("1.1.0", r); err == nil || !strings.Contains(err.Error(), "no address of its family") {
		t.Fatalf("an IPv6 route without an IPv6 address: %v", err)
	}
}

// runPlugin runs the built plugin as a runtime does: command and attachment in the
// environment, configuration on stdin. It returns stdout and whether it exited 0.
func runPlugin(t *testing.T, env []string, conf string) (string, bool) {
	t.Helper()
	cmd := exec.Command(filepath.Join(bins.Dir(t), "rampart-cni"))
	cmd.Env = append([]string{"CNI_PATH=/nonexistent"}, env...)
	cmd.Stdin = strings.NewReader(conf)
	var out bytes.Buffer
	cmd.Stdout = &out
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("running the plugin: %v", err)
	}
	return out.String(), err == nil
}

// The binary's output in the spec's formats: VERSION, and errors as JSON on stdout with a
// non-zero exit when the configuration is wrong or the agent is not there.
func TestBinaryOutput(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "none.sock")
	conf := `{"cniVersion":"1.1.0","name":"n","type":"rampart-cni","socket":"` + sock + `"}`
	out, ok := runPlugin(t, []string{"CNI_COMMAND=VERSION"}, conf)
	var v struct {
		CNIVersion        string   `json:"cniVersion"`
		SupportedVersions []string `json:"supportedVersions"`
	}
	if !ok || json.Unmarshal([]byte(out), &v) != nil || v.CNIVersion != "1.1.0" || strings.Join(v.SupportedVersions, ",") != "1.0.0,1.1.0" {
		t.Fatalf("VERSION: ok %v, %s", ok, out)
	}
	add := []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=c1", "CNI_NETNS=/nonexistent/netns", "CNI_IFNAME=eth0"}
	addIn := func(netns string) []string {
		return []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=c1", "CNI_NETNS=" + netns, "CNI_IFNAME=eth0"}
	}
	for _, tc := range []struct {
		name string
		env  []string
		conf string
		code uint
	}{
		{"ADD without agent", add, conf, types.ErrTryAgainLater},
		{"DEL without agent", []string{"CNI_COMMAND=DEL", "CNI_CONTAINERID=c1", "CNI_IFNAME=eth0"}, conf, types.ErrTryAgainLater},
		{"STATUS without agent", []string{"CNI_COMMAND=STATUS"}, conf, types.ErrPluginNotAvailable},
		{"ADD with bad CNI_ARGS", append(add, "CNI_ARGS=nonsense"), conf, types.ErrInvalidEnvironmentVariables},
		{"ADD with socket and instance", add, `{"cniVersion":"1.1.0","name":"n","type":"rampart-cni","socket":"/x","instance":"y"}`, types.ErrInvalidNetworkConfig},
		{"ADD of version 0.4.0", add, `{"cniVersion":"0.4.0","name":"n","type":"rampart-cni"}`, types.ErrIncompatibleCNIVersion},
		// No command, or one the spec does not have: an error, never a silent success.
		{"no CNI_COMMAND", []string{"CNI_CONTAINERID=c1", "CNI_NETNS=/nonexistent/netns", "CNI_IFNAME=eth0"}, conf, types.ErrInvalidEnvironmentVariables},
		{"unknown CNI_COMMAND", []string{"CNI_COMMAND=ATTACH", "CNI_CONTAINERID=c1", "CNI_IFNAME=eth0"}, conf, types.ErrInvalidEnvironmentVariables},
		// The runtime's own namespace (the node's): refused before the agent is asked
		// (none runs here, which would answer ErrTryAgainLater).
		{"ADD into the plugin's own namespace", addIn("/proc/self/ns/net"), conf, types.ErrInvalidNetNS},
	} {
		out, ok := runPlugin(t, tc.env, tc.conf)
		var e types.Error
		if ok || json.Unmarshal([]byte(out), &e) != nil || e.Code != tc.code || e.Msg == "" {
			t.Errorf("%s: ok %v, output %s; want error code %d", tc.name, ok, out, tc.code)
		}
	}
}
