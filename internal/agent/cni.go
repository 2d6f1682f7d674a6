package agent

// The CNI side of the agent: what the plugin (cmd/rampart-cni) asks for a runtime's ADD,
// DEL, CHECK and GC. A CNI endpoint is an ordinary endpoint (identity, policy, flows)
// whose veth the agent puts into a namespace the runtime made and owns: the agent deletes
// the veth, never the namespace.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/podaddr"
)

// cniContainerIDRE is the CNI spec's container ID: alphanumerics, '-', '_' and '.',
// starting with an alphanumeric.
var cniContainerIDRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// cniDefaultNamespace holds CNI endpoints whose runtime names no pod (no K8S_POD_* args).
const cniDefaultNamespace = "default"

func validateCNIAttachment(at api.CNIAttachment) error {
	if len(at.ContainerID) > 256 || !cniContainerIDRE.MatchString(at.ContainerID) {
		return api.BadRequest("container ID %q: want 1 to 256 letters, digits, '-', '_', '.', starting with a letter or digit", at.ContainerID)
	}
	// The kernel's rule for interface names (dev_valid_name).
	if at.IfName == "" || len(at.IfName) > 15 || at.IfName == "." || at.IfName == ".." || strings.ContainsAny(at.IfName, "/: \t\n\x00") {
		return api.BadRequest("interface name %q: want 1 to 15 characters, not '.' or '..', without '/', ':' or white space", at.IfName)
	}
	return nil
}

// cniEndpointName is the endpoint name of a container without pod name: cni- and 12 hex
// digits of a hash of its ID and interface.
func cniEndpointName(at api.CNIAttachment) string {
	sum := sha256.Sum256([]byte(at.ContainerID + "\x00" + at.IfName))
	return "cni-" + hex.EncodeToString(sum[:6])
}

// cniRecord finds the endpoint of an attachment; a.mu must be held.
func (a *Agent) cniRecord(at api.CNIAttachment) *EndpointRecord {
	for _, rec := range a.model.endpoints {
		if rec.CNI != nil && rec.CNI.ContainerID == at.ContainerID && rec.CNI.IfName == at.IfName {
			return rec
		}
	}
	return nil
}

// CNIAdd makes an endpoint in the runtime's namespace req.Netns, named after the pod
// (req.PodNamespace/req.PodName), with no labels of its own. An ADD repeated for an
// attachment that is intact answers as the first did.
func (a *Agent) CNIAdd(ctx context.Context, req api.CNIAddRequest) (api.CNIResult, error) {
	at := api.CNIAttachment{ContainerID: req.ContainerID, IfName: req.IfName}
	if err := validateCNIAttachment(at); err != nil {
		return api.CNIResult{}, err
	}
	if !filepath.IsAbs(req.Netns) || filepath.Clean(req.Netns) != req.Netns {
		return api.CNIResult{}, api.BadRequest("network namespace %q: want a clean absolute path", req.Netns)
	}
	if !endpoint.IsNetns(req.Netns) {
		return api.CNIResult{}, api.BadRequest("network namespace %s: not a network namespace", req.Netns)
	}
	ns, name := req.PodNamespace, req.PodName
	switch {
	case ns == "" && name == "":
		ns, name = cniDefaultNamespace, cniEndpointName(at)
	case ns == "" || name == "":
		return api.CNIResult{}, api.BadRequest("pod namespace %q and name %q: want both or neither", ns, name)
	}
	if err := validateNamespace(ns); err != nil {
		return api.CNIResult{}, err
	}
	if err := validateName(name); err != nil {
		return api.CNIResult{}, err
	}
	// Kubernetes mode: the pod's labels, service account and identity come from the API,
	// before the endpoint exists (fail closed: never an endpoint without its labels).
	var pod *PodInfo
	if a.cfg.Kubernetes != nil {
		if req.PodNamespace == "" {
			return api.CNIResult{}, api.BadRequest("Kubernetes mode: the runtime must name the pod (K8S_POD_NAMESPACE, K8S_POD_NAME)")
		}
		p, err := a.cniPod(ctx, ns, name)
		if err != nil {
			return api.CNIResult{}, err
		}
		l, err := validateLabels(p.Labels)
		if err != nil {
			return api.CNIResult{}, err
		}
		p.Labels = l
		if p.Ports, err = validPortRecords(p.Ports); err != nil {
			return api.CNIResult{}, api.BadRequest("pod %s/%s: %v", ns, name, err)
		}
		pod = &p
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	if rec := a.cniRecord(at); rec != nil {
		if rec.CNI.Netns == req.Netns && rec.Namespace == ns && rec.Name == name {
			if ep, err := a.net.LookupIn(rec.Namespace, rec.Name, rec.IP, rec.CNI.attachment()); err == nil {
				return a.cniResult(rec, ep), nil
			}
		}
		return api.CNIResult{}, api.Conflict("container %s interface %s already has endpoint %s (network namespace %s)", at.ContainerID, at.IfName, rec.Key(), rec.CNI.Netns)
	}
	spec := &EndpointRecord{
		Namespace: ns,
		Name:      name,
		Labels:    labels.Labels{},
		CNI:       &CNIRecord{ContainerID: at.ContainerID, IfName: at.IfName, Netns: req.Netns},
	}
	if pod != nil {
		spec.Labels, spec.ServiceAccount, spec.Identity, spec.Ports = pod.Labels, pod.ServiceAccount, pod.Identity, pod.Ports
		// A monitor pod gets its receive and return interfaces with its endpoint, as
		// `rampart endpoint add --monitor` makes them.
		spec.Monitor = pod.Monitor
		spec.Audit = pod.Audit
	}
	rec, ep, err := a.addRecord(spec, "")
	if errors.Is(err, endpoint.ErrNotPodNetns) {
		// The runtime's mistake (or an attempt on the node's network), not the agent's.
		return api.CNIResult{}, api.BadRequest("%v", err)
	}
	if err != nil {
		return api.CNIResult{}, err
	}
	return a.cniResult(rec, ep), nil
}

// cniResult renders a CNI endpoint; a.mu must be held.
func (a *Agent) cniResult(rec *EndpointRecord, ep endpoint.Endpoint) api.CNIResult {
	r := api.CNIResult{
		Namespace:     rec.Namespace,
		Name:          rec.Name,
		ContainerID:   rec.CNI.ContainerID,
		Netns:         rec.CNI.Netns,
		IfName:        rec.CNI.IfName,
		MAC:           ep.PodMAC,
		HostInterface: rec.HostInterface,
		HostMAC:       ep.HostMAC,
		IP:            netip.PrefixFrom(rec.IP, 32).String(),
		Gateway:       a.net.Router().String(),
		Routes:        []string{"0.0.0.0/0"},
		Identity:      a.cur.identities[rec.Key()],
	}
	if rec.IP6.IsValid() {
		r.IP6 = netip.PrefixFrom(rec.IP6, 128).String()
		r.Gateway6 = podaddr.RouterLinkLocal.String()
		r.Routes = append(r.Routes, "::/0")
	}
	return r
}

// CNIDel deletes an attachment's endpoint: its policy, programs and veth. An attachment
// the agent does not have (deleted already, or never added) is no error, as the CNI spec
// asks of DEL.
func (a *Agent) CNIDel(ctx context.Context, at api.CNIAttachment) error {
	if err := validateCNIAttachment(at); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	rec := a.cniRecord(at)
	if rec == nil {
		return nil
	}
	return a.deleteRecord(rec)
}

// CNICheck checks that an attachment's endpoint is as the agent made it: in the same
// namespace, its veth present with its address there, its programs attached to that veth.
func (a *Agent) CNICheck(ctx context.Context, req api.CNICheckRequest) (api.CNIResult, error) {
	if err := validateCNIAttachment(req.CNIAttachment); err != nil {
		return api.CNIResult{}, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	rec := a.cniRecord(req.CNIAttachment)
	if rec == nil {
		return api.CNIResult{}, api.NotFound("container %s interface %s: no endpoint", req.ContainerID, req.IfName)
	}
	if req.Netns != "" && req.Netns != rec.CNI.Netns {
		return api.CNIResult{}, api.Conflict("endpoint %s: network namespace is %s, not %s", rec.Key(), rec.CNI.Netns, req.Netns)
	}
	ep, err := a.net.LookupIn(rec.Namespace, rec.Name, rec.IP, rec.CNI.attachment())
	if err != nil {
		return api.CNIResult{}, api.Conflict("%v", err)
	}
	// The dataplane holds the endpoint's info (without it its programs drop everything).
	ifindex, ok := a.ifindex[rec.EpID]
	if inst, found := a.dp.InstalledEndpoints()[ifindex]; !ok || !found || inst.EpID != rec.EpID || inst.Addr != rec.IP {
		return api.CNIResult{}, api.Conflict("endpoint %s: not in the dataplane on its interface %s", rec.Key(), ep.HostIfName)
	}
	return a.cniResult(rec, ep), nil
}

// CNIGC deletes every CNI endpoint whose attachment is not in req.Valid. Endpoints made
// by `rampart endpoint add` are not the runtime's and stay.
func (a *Agent) CNIGC(ctx context.Context, req api.CNIGCRequest) (api.CNIGCResult, error) {
	valid := make(map[api.CNIAttachment]bool, len(req.Valid))
	for _, at := range req.Valid {
		valid[at] = true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	out := api.CNIGCResult{Deleted: []api.CNIAttachment{}}
	var errs []error
	for _, key := range sortedKeys(a.model.endpoints) {
		rec := a.model.endpoints[key]
		if rec.CNI == nil {
			continue
		}
		at := api.CNIAttachment{ContainerID: rec.CNI.ContainerID, IfName: rec.CNI.IfName}
		if valid[at] {
			continue
		}
		if err := a.deleteRecord(rec); err != nil {
			errs = append(errs, err)
			continue
		}
		out.Deleted = append(out.Deleted, at)
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("garbage-collecting CNI endpoints: %w", errors.Join(errs...))
	}
	return out, nil
}
