package cniinstall

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// ConfName is the configuration list's file name. The runtime takes the first file of the
// configuration directory in lexical order; 05 puts Rampart ahead of the usual 10-*
// defaults, as Cilium's 05-cilium.conflist does.
const ConfName = "05-rampart.conflist"

// PluginName is the plugin's binary name, the "type" of its entry in the list.
const PluginName = "rampart-cni"

// NetworkName is the configuration list's network name.
const NetworkName = "rampart"

// CNIVersion is the configuration list's spec version (1.1.0 adds GC and STATUS, which
// the plugin serves).
const CNIVersion = "1.1.0"

// Options say what to install where.
type Options struct {
	// Plugin is the rampart-cni binary to copy (the agent's image ships it beside rampartd).
	Plugin string
	// BinDir is the runtime's CNI binary directory (usually /opt/cni/bin).
	BinDir string
	// ConfDir is the runtime's CNI configuration directory (usually /etc/cni/net.d).
	ConfDir string
	// Socket is the agent's API socket the plugin calls, as the runtime's host sees it.
	Socket string
}

// Conflist returns the configuration list for the agent serving on socket.
func Conflist(socket string) ([]byte, error) {
	conf := map[string]any{
		"cniVersion": CNIVersion,
		"name":       NetworkName,
		"plugins":    []any{map[string]any{"type": PluginName, "socket": socket}},
	}
	data, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// Install copies the plugin into BinDir, then writes the configuration list into ConfDir,
// each atomically (temporary file, fsync, rename). Both directories are created if missing.
// Running it again replaces both with the current ones. Errors name the path.
func Install(opts Options) error {
	if opts.Plugin == "" || opts.BinDir == "" || opts.ConfDir == "" || opts.Socket == "" {
		return errors.New("installing the CNI plugin: Plugin, BinDir, ConfDir and Socket are required")
	}
	if !filepath.IsAbs(opts.Socket) {
		return fmt.Errorf("installing the CNI plugin: socket %q: want an absolute path", opts.Socket)
	}
	src, err := os.Open(opts.Plugin)
	if err != nil {
		return fmt.Errorf("installing the CNI plugin: %w", err)
	}
	defer src.Close()
	if fi, err := src.Stat(); err != nil {
		return fmt.Errorf("installing the CNI plugin: %w", err)
	} else if !fi.Mode().IsRegular() {
		return fmt.Errorf("installing the CNI plugin: %s: not a regular file", opts.Plugin)
	}
	if err := writeAtomic(filepath.Join(opts.BinDir, PluginName), 0o755, src); err != nil {
		return err
	}
	conf, err := Conflist(opts.Socket)
	if err != nil {
		return fmt.Errorf("installing the CNI configuration: %w", err)
	}
	return writeAtomic(filepath.Join(opts.ConfDir, ConfName), 0o644, bytes.NewReader(conf))
}

// Uninstall removes the configuration list, then the plugin; either missing is no error.
// The configuration goes first, so the runtime stops calling the plugin before it goes.
func Uninstall(binDir, confDir string) error {
	var errs []error
	for _, p := range []string{filepath.Join(confDir, ConfName), filepath.Join(binDir, PluginName)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing %s: %w", p, err))
		}
	}
	return errors.Join(errs...)
}

// writeAtomic writes r to path through a temporary file in the same directory (a rename
// within a file system is atomic), whose name starts with a dot and does not end in
// .conf, .conflist or .json, so a runtime listing the directory never takes it for a
// configuration.
func writeAtomic(path string, mode fs.FileMode, r io.Reader) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, r); err != nil {
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(mode); err != nil {
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("installing %s: %w", path, err)
	}
	return nil
}
