package main

import (
	"archive/tar"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

func cmdUnpack(args []string) error {
	fs := flag.NewFlagSet("unpack", flag.ContinueOnError)
	dir := fs.String("layout", "target/image/oci", "OCI image layout directory")
	ref := fs.String("ref", "", "the image's ref name in the layout, e.g. topodra-kubelet-plugin:0.1.0")
	pull := fs.String("pull", "", "instead of -ref: an image reference to pull from its registry, e.g. registry.example.com/gpu/topodra-kubelet-plugin:0.1.0@sha256:...")
	insecure := fs.Bool("insecure", false, "with -pull: allow plain HTTP to the registry (localhost and 127.0.0.1 always are)")
	dest := fs.String("dest", "", "directory to write the root filesystem into (missing or empty)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if (*ref == "") == (*pull == "") || *dest == "" {
		return errors.New("one of -ref and -pull, and -dest, are required")
	}
	var img v1.Image
	var err error
	if *pull != "" {
		img, err = pullImage(*pull, *insecure)
	} else {
		img, err = imageByRef(*dir, *ref)
	}
	if err != nil {
		return err
	}
	return unpack(img, *dest)
}

// pullImage reads an image from its registry, with the credentials docker would use. A
// reference with a digest is checked against it: the registry cannot hand over other
// bytes.
func pullImage(ref string, insecure bool) (v1.Image, error) {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return nil, err
	}
	img, err := remote.Image(r, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	return img, nil
}

// imageByRef finds the image whose org.opencontainers.image.ref.name is ref.
func imageByRef(dir, ref string) (v1.Image, error) {
	lp, m, err := layoutIndex(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, d := range m.Manifests {
		n := d.Annotations[refNameKey]
		if n == ref {
			return lp.Image(d.Digest)
		}
		names = append(names, n)
	}
	return nil, fmt.Errorf("no image %q in %s (it has: %s)", ref, dir, strings.Join(names, ", "))
}

// layoutIndex opens an OCI image layout and reads its index.
func layoutIndex(dir string) (layout.Path, *v1.IndexManifest, error) {
	lp, err := layout.FromPath(dir)
	if err != nil {
		return "", nil, fmt.Errorf("%s: %w (run make image first)", dir, err)
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return "", nil, err
	}
	m, err := idx.IndexManifest()
	if err != nil {
		return "", nil, err
	}
	return lp, m, nil
}

// unpack writes the image's file system into dest: the layers flattened in order
// (go-containerregistry's Extract, which applies whiteouts), with owners when run as
// root. Nothing is written through a symbolic link: an absolute link in the image
// (/lib64/ld-linux-x86-64.so.2 -> /lib/...) must not lead to the host's files.
func unpack(img v1.Image, dest string) error {
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return err
	}
	if ents, err := os.ReadDir(dest); err != nil {
		return err
	} else if len(ents) > 0 {
		return fmt.Errorf("%s is not empty", dest)
	}
	root, err := filepath.Abs(dest)
	if err != nil {
		return err
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	asRoot := os.Geteuid() == 0
	type dirMeta struct {
		path  string
		mode  os.FileMode
		mtime time.Time
	}
	var dirs []dirMeta
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		rel, err := cleanTarPath(h.Name)
		if err != nil {
			return err
		}
		if rel == "" {
			continue
		}
		target := filepath.Join(root, filepath.FromSlash(rel))
		if err := mkParents(root, rel); err != nil {
			return err
		}
		mode := os.FileMode(h.Mode & 0o777)
		if h.Mode&0o4000 != 0 {
			mode |= os.ModeSetuid
		}
		if h.Mode&0o2000 != 0 {
			mode |= os.ModeSetgid
		}
		if h.Mode&0o1000 != 0 {
			mode |= os.ModeSticky
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if fi, err := os.Lstat(target); err == nil && !fi.IsDir() {
				return fmt.Errorf("/%s: a directory over a non-directory", rel)
			}
			if err := os.MkdirAll(target, 0o755); err != nil {
				return err
			}
			// Modes last: a read-only directory would refuse its own children.
			dirs = append(dirs, dirMeta{target, mode, h.ModTime})
		case tar.TypeReg:
			if err := removeNonDir(target); err != nil {
				return err
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
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
		case tar.TypeSymlink:
			if err := removeNonDir(target); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		case tar.TypeLink:
			src, err := cleanTarPath(h.Linkname)
			if err != nil {
				return err
			}
			if err := removeNonDir(target); err != nil {
				return err
			}
			if err := os.Link(filepath.Join(root, filepath.FromSlash(src)), target); err != nil {
				return err
			}
			continue
		default:
			return fmt.Errorf("/%s: unsupported entry type %q", rel, h.Typeflag)
		}
		if asRoot {
			if err := os.Lchown(target, h.Uid, h.Gid); err != nil {
				return err
			}
		}
		if h.Typeflag == tar.TypeReg {
			if err := os.Chmod(target, mode); err != nil {
				return err
			}
			if err := os.Chtimes(target, h.ModTime, h.ModTime); err != nil {
				return err
			}
		}
	}
	// Deepest first, so that setting a directory's time is not undone by its
	// children's.
	slices.SortFunc(dirs, func(a, b dirMeta) int { return strings.Compare(b.path, a.path) })
	for _, d := range dirs {
		if err := os.Chmod(d.path, d.mode); err != nil {
			return err
		}
		if err := os.Chtimes(d.path, d.mtime, d.mtime); err != nil {
			return err
		}
	}
	return nil
}

// mkParents creates the directories above rel and refuses a parent that exists as
// anything but a directory (a symbolic link in particular).
func mkParents(root, rel string) error {
	dir := root
	parts := strings.Split(path.Dir(rel), "/")
	if path.Dir(rel) == "." {
		return nil
	}
	for _, c := range parts {
		dir = filepath.Join(dir, c)
		fi, err := os.Lstat(dir)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(dir, 0o755); err != nil {
				return err
			}
		case err != nil:
			return err
		case !fi.IsDir():
			return fmt.Errorf("%s: a parent of /%s is not a directory", dir, rel)
		}
	}
	return nil
}

func removeNonDir(p string) error {
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("%s: a file over a directory", p)
	}
	return os.Remove(p)
}
