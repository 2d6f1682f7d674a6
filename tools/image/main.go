// Command image packs Rampart's OCI image from files on disk, without a daemon or a
// registry (go-containerregistry), into a Docker image archive that `ctr images import`
// and `podman load` read; and checks such an archive. scripts/build-image.sh runs it.
//
//	image build --out FILE --tag REF [--tag REF...] --entrypoint PATH [--env K=V...] DEST=SRC...
//	image check [--extract DIR] FILE
//
// build puts each SRC at DEST (an absolute path in the image; SRC's mode is kept) in one
// layer, with the directories above them, /tmp, /run and /var/run -> /run. Every entry has
// the same time (SOURCE_DATE_EPOCH, default 0), so the same files give the same image.
// check reads the archive back, validates every manifest, config and layer digest, prints
// each tag with the image's digest, size and entrypoint, and with --extract unpacks the
// image's file system into DIR.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: image build|check ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "build":
		err = build(os.Args[2:])
	case "check":
		err = check(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want build or check", os.Args[1])
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
}

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

func build(args []string) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	out := fs.String("out", "", "the archive to write")
	entry := fs.String("entrypoint", "", "the image's entrypoint")
	var tags, env list
	fs.Var(&tags, "tag", "a name of the image (repeatable)")
	fs.Var(&env, "env", "an environment variable K=V (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || len(tags) == 0 || *entry == "" || fs.NArg() == 0 {
		return errors.New("build: --out, --tag, --entrypoint and at least one DEST=SRC are required")
	}
	mtime := time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
		}
		mtime = time.Unix(sec, 0).UTC()
	}
	files := map[string]string{}
	for _, a := range fs.Args() {
		dest, src, ok := strings.Cut(a, "=")
		if !ok || !path.IsAbs(dest) || src == "" {
			return fmt.Errorf("build: %q: want DEST=SRC with an absolute DEST", a)
		}
		files[path.Clean(dest)] = src
	}
	layerData, err := layerTar(files, mtime)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerData)), nil
	})
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = "linux", "amd64"
	cfg.Created = v1.Time{Time: mtime}
	cfg.Config.Entrypoint = []string{*entry}
	cfg.Config.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, env...)
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return err
	}
	refs := map[name.Reference]v1.Image{}
	for _, t := range tags {
		ref, err := name.NewTag(t, name.StrictValidation)
		if err != nil {
			return fmt.Errorf("--tag %q: %w", t, err)
		}
		refs[ref] = img
	}
	tmp := *out + ".tmp"
	if err := tarball.MultiRefWriteToFile(tmp, refs); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, *out); err != nil {
		return err
	}
	d, _ := img.Digest()
	fmt.Printf("%s %s\n", *out, d)
	return nil
}

// layerTar returns the layer: the directories above the files, the files, and the fixed
// entries every image of this kind has.
func layerTar(files map[string]string, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{"tmp": true, "run": true, "var": true}
	for dest := range files {
		for d := path.Dir(strings.TrimPrefix(dest, "/")); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var names []string
	for d := range dirs {
		names = append(names, d)
	}
	sort.Strings(names)
	for _, d := range names {
		mode := int64(0o755)
		if d == "tmp" {
			mode = 0o1777
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: mode, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	// /var/run is /run, as on the hosts the agent runs on: the DaemonSet mounts
	// /var/run/netns.
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "var/run", Linkname: "../run", Mode: 0o777, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	var dests []string
	for d := range files {
		dests = append(dests, d)
	}
	sort.Strings(dests)
	for _, dest := range dests {
		src := files[dest]
		fi, err := os.Stat(src)
		if err != nil {
			return nil, err
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("%s: not a regular file", src)
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dest, "/"), Mode: int64(fi.Mode().Perm()), Size: fi.Size(), ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
		f, err := os.Open(src)
		if err != nil {
			return nil, err
		}
		_, err = io.Copy(tw, f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", src, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func check(args []string) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	extract := fs.String("extract", "", "unpack the image's file system into this directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("check: want one archive")
	}
	file := fs.Arg(0)
	mf, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(file) })
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if len(mf) == 0 {
		return fmt.Errorf("%s: no image", file)
	}
	for _, desc := range mf {
		for _, t := range desc.RepoTags {
			tag, err := name.NewTag(t, name.StrictValidation)
			if err != nil {
				return fmt.Errorf("%s: tag %q: %w", file, t, err)
			}
			img, err := tarball.ImageFromPath(file, &tag)
			if err != nil {
				return fmt.Errorf("%s: %s: %w", file, t, err)
			}
			if err := validate.Image(img); err != nil {
				return fmt.Errorf("%s: %s: %w", file, t, err)
			}
			d, _ := img.Digest()
			cfg, err := img.ConfigFile()
			if err != nil {
				return err
			}
			layers, err := img.Layers()
			if err != nil {
				return err
			}
			var size int64
			for _, l := range layers {
				s, err := l.Size()
				if err != nil {
					return err
				}
				size += s
			}
			fmt.Printf("%s %s %s/%s layers=%d bytes=%d entrypoint=%s\n", t, d, cfg.OS, cfg.Architecture, len(layers), size, strings.Join(cfg.Config.Entrypoint, " "))
			if *extract != "" {
				if err := unpack(img, *extract); err != nil {
					return err
				}
				*extract = "" // once: every tag names the same image
			}
		}
	}
	return nil
}

// unpack writes the image's flattened file system into dir (regular files, directories
// and symbolic links; nothing else is in these images).
func unpack(img v1.Image, dir string) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.FromSlash(path.Clean("/"+h.Name)))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, os.FileMode(h.Mode).Perm()|0o700); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode).Perm())
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("unpacking %s: unexpected entry type %c", h.Name, h.Typeflag)
		}
	}
}
