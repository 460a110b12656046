package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
	"time"
)

// node is one file system entry of an image. Paths are relative to the root, clean,
// without a leading "/" or "./".
type node struct {
	path     string
	typ      byte // tar.TypeDir, tar.TypeReg or tar.TypeSymlink
	mode     int64
	uid, gid int
	link     string
	data     []byte
	// origin names where the entry came from (a package, "topodra"), for messages.
	origin string
}

// layerFS is the content of one layer: its entries, and the metadata of the
// directories its packages declare, used for the parents the layer needs.
type layerFS struct {
	nodes map[string]*node
	dirs  map[string]*node
}

func newLayerFS() *layerFS {
	return &layerFS{nodes: map[string]*node{}, dirs: map[string]*node{}}
}

// add puts n into the layer. Two packages may declare the same directory; any
// other collision is an error, since which one wins would depend on the order.
func (l *layerFS) add(n *node) error {
	if n.typ == tar.TypeDir {
		if _, ok := l.dirs[n.path]; !ok {
			l.dirs[n.path] = n
		}
		return nil
	}
	if old, ok := l.nodes[n.path]; ok {
		if old.typ == n.typ && old.link == n.link && old.mode == n.mode && bytes.Equal(old.data, n.data) {
			return nil
		}
		return fmt.Errorf("/%s is in both %s and %s", n.path, old.origin, n.origin)
	}
	l.nodes[n.path] = n
	return nil
}

// addExplicitDir adds a directory that the layer holds even when empty (/tmp).
func (l *layerFS) addExplicitDir(n *node) {
	l.nodes[n.path] = n
	l.dirs[n.path] = n
}

// usrMerged maps a package path to its place in a /usr-merged tree: Debian 12 packages
// still ship /lib/x86_64-linux-gnu/libc.so.6, which a Debian 12 system keeps in
// /usr/lib behind the /lib -> usr/lib link. One library directory makes the plugin's
// RPATH (kubelet-plugin/build.rs) a single entry.
func usrMerged(p string) string {
	first, _, _ := strings.Cut(p, "/")
	switch first {
	case "bin", "sbin", "lib", "lib32", "lib64", "libx32":
		return "usr/" + p
	}
	return p
}

// mergedLinks are the top-level links of a /usr-merged tree.
var mergedLinks = []string{"bin", "lib", "lib64", "sbin"}

// keepFile says whether a package file goes into the image. Documentation except the
// copyright file, manuals, locales and iconv modules are dropped: nothing in the image
// reads them, and they are most of glibc's size.
func keepFile(rule pkgRule, p string, typ byte) bool {
	if rest, ok := strings.CutPrefix(p, "usr/share/doc/"); ok {
		pkg, file, sub := strings.Cut(rest, "/")
		if !sub {
			// /usr/share/doc/libgcc-s1 -> gcc-12-base
			return typ == tar.TypeSymlink && rule.only == nil
		}
		return file == "copyright" && pkg != ""
	}
	if rule.only != nil {
		return slices.Contains(rule.only, p)
	}
	for _, dropped := range []string{"usr/share/man/", "usr/share/info/", "usr/share/locale/", "usr/share/lintian/", "usr/share/bug/", "usr/share/common-licenses/"} {
		if strings.HasPrefix(p, dropped) {
			return false
		}
	}
	if strings.Contains(p, "/gconv/") {
		return false
	}
	return true
}

// cleanTarPath turns "./usr/lib/" into "usr/lib"; "" is the root.
func cleanTarPath(name string) (string, error) {
	p := path.Clean("/" + name)
	if p == "/" {
		return "", nil
	}
	p = strings.TrimPrefix(p, "/")
	for _, c := range strings.Split(p, "/") {
		if c == ".." {
			return "", fmt.Errorf("path %q leaves the root", name)
		}
	}
	return p, nil
}

// relocateLink keeps a relative symbolic link pointing at the same file after the
// /usr merge moved it (from is the link's original path).
func relocateLink(from, to, target string) string {
	if path.IsAbs(target) || from == to {
		return target
	}
	abs := usrMerged(strings.TrimPrefix(path.Join(path.Dir("/"+from), target), "/"))
	rel, err := relPath(path.Dir(to), abs)
	if err != nil {
		return "/" + abs
	}
	return rel
}

// relPath is filepath.Rel for slash paths relative to the root.
func relPath(fromDir, to string) (string, error) {
	split := func(p string) []string {
		if p == "" || p == "." {
			return nil
		}
		return strings.Split(p, "/")
	}
	a, b := split(fromDir), split(to)
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	parts := make([]string, 0, len(a)-i+len(b)-i)
	for range a[i:] {
		parts = append(parts, "..")
	}
	parts = append(parts, b[i:]...)
	if len(parts) == 0 {
		return "", errors.New("same path")
	}
	return strings.Join(parts, "/"), nil
}

// addPackageTar adds the files of a package's data archive (dpkg-deb --fsys-tarfile)
// that rule keeps. Hard links become copies of their target, which the archive has
// already given.
func addPackageTar(l *layerFS, rule pkgRule, r io.Reader) error {
	tr := tar.NewReader(r)
	seen := map[string]*node{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", rule.name, err)
		}
		orig, err := cleanTarPath(h.Name)
		if err != nil {
			return fmt.Errorf("%s: %w", rule.name, err)
		}
		if orig == "" {
			continue
		}
		p := usrMerged(orig)
		n := &node{path: p, mode: h.Mode & 07777, uid: h.Uid, gid: h.Gid, origin: rule.name}
		switch h.Typeflag {
		case tar.TypeDir:
			n.typ = tar.TypeDir
		case tar.TypeReg:
			n.typ = tar.TypeReg
			if n.data, err = io.ReadAll(tr); err != nil {
				return fmt.Errorf("%s: /%s: %w", rule.name, orig, err)
			}
		case tar.TypeSymlink:
			n.typ = tar.TypeSymlink
			n.link = relocateLink(orig, p, h.Linkname)
		case tar.TypeLink:
			target, err := cleanTarPath(h.Linkname)
			if err != nil {
				return fmt.Errorf("%s: %w", rule.name, err)
			}
			t, ok := seen[usrMerged(target)]
			if !ok || t.typ != tar.TypeReg {
				return fmt.Errorf("%s: hard link /%s to /%s, which is not a file before it", rule.name, orig, target)
			}
			n.typ, n.data = tar.TypeReg, t.data
		default:
			return fmt.Errorf("%s: /%s: unsupported entry type %q", rule.name, orig, h.Typeflag)
		}
		seen[p] = n
		if n.typ == tar.TypeDir {
			if err := l.add(n); err != nil {
				return err
			}
			continue
		}
		if !keepFile(rule, p, n.typ) {
			continue
		}
		if err := l.add(n); err != nil {
			return err
		}
	}
}

// writeLayer writes the layer as an uncompressed tar: entries sorted by path, each
// preceded by its parent directories, every time the given one, no user or group
// names, no extended attributes. The same content gives the same bytes.
func writeLayer(l *layerFS, mtime time.Time) ([]byte, error) {
	all := map[string]*node{}
	for p, n := range l.nodes {
		all[p] = n
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := all[d]; ok {
				continue
			}
			if dn, ok := l.dirs[d]; ok {
				all[d] = dn
			} else {
				all[d] = &node{path: d, typ: tar.TypeDir, mode: 0o755, origin: "topodra"}
			}
		}
	}
	paths := make([]string, 0, len(all))
	for p := range all {
		paths = append(paths, p)
	}
	slices.Sort(paths)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		n := all[p]
		h := &tar.Header{
			Name:     p,
			Typeflag: n.typ,
			Mode:     n.mode,
			Uid:      n.uid,
			Gid:      n.gid,
			ModTime:  mtime,
			Format:   tar.FormatPAX,
		}
		switch n.typ {
		case tar.TypeDir:
			h.Name += "/"
		case tar.TypeSymlink:
			h.Linkname = n.link
		case tar.TypeReg:
			h.Size = int64(len(n.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("/%s: %w", p, err)
		}
		if n.typ == tar.TypeReg {
			if _, err := tw.Write(n.data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// imageTree is the union of an image's layers, for the checks on the whole image.
type imageTree map[string]*node

func (t imageTree) merge(l *layerFS) {
	for p, n := range l.nodes {
		t[p] = n
	}
	for p, n := range l.dirs {
		if _, ok := t[p]; !ok {
			t[p] = n
		}
	}
}

// resolve follows symbolic links (in every component) inside the image and returns
// the entry p names, or nil.
func (t imageTree) resolve(p string) *node {
	return t.resolveDepth(strings.TrimPrefix(path.Clean("/"+p), "/"), 0)
}

func (t imageTree) resolveDepth(p string, depth int) *node {
	if depth > 40 {
		return nil
	}
	parts := strings.Split(p, "/")
	cur := ""
	for i, c := range parts {
		next := c
		if cur != "" {
			next = cur + "/" + c
		}
		n, ok := t[next]
		if !ok {
			// A directory only implied by its children.
			if i < len(parts)-1 {
				cur = next
				continue
			}
			if t.hasChildren(next) {
				return &node{path: next, typ: tar.TypeDir}
			}
			return nil
		}
		if n.typ == tar.TypeSymlink {
			target := n.link
			if !path.IsAbs(target) {
				target = path.Join("/"+path.Dir(next), target)
			}
			rest := strings.Join(parts[i+1:], "/")
			full := strings.TrimPrefix(path.Clean(target+"/"+rest), "/")
			return t.resolveDepth(full, depth+1)
		}
		if i == len(parts)-1 {
			return n
		}
		cur = next
	}
	return nil
}

func (t imageTree) hasChildren(dir string) bool {
	prefix := dir + "/"
	for p := range t {
		if strings.HasPrefix(p, prefix) {
			return true
		}
	}
	return false
}
