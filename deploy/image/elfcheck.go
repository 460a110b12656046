package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"path"
	"slices"
	"strings"
)

// platform is what the images are built for: the OCI platform and the matching
// Debian multiarch triplet and ELF machine.
type platform struct {
	arch      string // OCI / Go architecture: amd64, arm64
	multiarch string
	machine   elf.Machine
}

var platforms = map[string]platform{
	"amd64": {arch: "amd64", multiarch: "x86_64-linux-gnu", machine: elf.EM_X86_64},
	"arm64": {arch: "arm64", multiarch: "aarch64-linux-gnu", machine: elf.EM_AARCH64},
}

// runtimeLib is a shared library a binary loads at start, as found in the image.
type runtimeLib struct {
	Soname string `json:"soname"`
	Path   string `json:"path"`
	// Package is the Debian package that put it there.
	Package string `json:"package"`
}

// checkELF verifies that the binary at bin (an image path) can start in the image: it
// is built for the platform, its program interpreter is there, and every library in
// the closure of its DT_NEEDED entries resolves inside the image through its RPATH or
// the default directories, as ld.so would find them with an empty LD_LIBRARY_PATH.
// It returns those libraries. A file that is not ELF is left alone.
func checkELF(t imageTree, bin string, pf platform) ([]runtimeLib, error) {
	n := t.resolve(bin)
	if n == nil || n.typ != tar.TypeReg {
		return nil, fmt.Errorf("/%s: not a file in the image", bin)
	}
	f, err := elf.NewFile(bytes.NewReader(n.data))
	if err != nil {
		return nil, nil
	}
	defer f.Close()
	if f.Machine != pf.machine {
		return nil, fmt.Errorf("/%s is built for %v, not %s", bin, f.Machine, pf.arch)
	}
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		buf := make([]byte, p.Filesz)
		if _, err := p.ReadAt(buf, 0); err != nil {
			return nil, fmt.Errorf("/%s: reading its interpreter: %w", bin, err)
		}
		interp := strings.TrimRight(string(buf), "\x00")
		if in := t.resolve(interp); in == nil || in.typ == tar.TypeDir {
			return nil, fmt.Errorf("/%s: its interpreter %s is not in the image", bin, interp)
		}
	}
	rpath, err := searchPath(f, bin)
	if err != nil {
		return nil, err
	}
	defaults := []string{"/usr/lib/" + pf.multiarch, "/lib/" + pf.multiarch, "/usr/lib", "/lib"}

	var libs []runtimeLib
	found := map[string]bool{}
	queue, err := f.ImportedLibraries()
	if err != nil {
		return nil, fmt.Errorf("/%s: %w", bin, err)
	}
	for len(queue) > 0 {
		soname := queue[0]
		queue = queue[1:]
		if found[soname] {
			continue
		}
		var hit *node
		var where string
		for _, dir := range slices.Concat(rpath, defaults) {
			if c := t.resolve(path.Join(dir, soname)); c != nil && c.typ == tar.TypeReg {
				hit, where = c, path.Join(dir, soname)
				break
			}
		}
		if hit == nil {
			return nil, fmt.Errorf("/%s needs %s, which is not in the image", bin, soname)
		}
		found[soname] = true
		libs = append(libs, runtimeLib{Soname: soname, Path: where, Package: hit.origin})
		lf, err := elf.NewFile(bytes.NewReader(hit.data))
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", where, soname, err)
		}
		if lf.Machine != pf.machine {
			lf.Close()
			return nil, fmt.Errorf("%s is built for %v, not %s", where, lf.Machine, pf.arch)
		}
		more, err := lf.ImportedLibraries()
		lf.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		queue = append(queue, more...)
	}
	slices.SortFunc(libs, func(a, b runtimeLib) int { return strings.Compare(a.Soname, b.Soname) })
	return libs, nil
}

// searchPath is the binary's DT_RPATH (or DT_RUNPATH) with $ORIGIN expanded.
func searchPath(f *elf.File, bin string) ([]string, error) {
	var dirs []string
	for _, tag := range []elf.DynTag{elf.DT_RPATH, elf.DT_RUNPATH} {
		vals, err := f.DynString(tag)
		if err != nil {
			return nil, fmt.Errorf("/%s: %w", bin, err)
		}
		for _, v := range vals {
			for _, d := range strings.Split(v, ":") {
				origin := path.Dir("/" + bin)
				d = strings.ReplaceAll(strings.ReplaceAll(d, "${ORIGIN}", origin), "$ORIGIN", origin)
				if d != "" {
					dirs = append(dirs, path.Clean(d))
				}
			}
		}
	}
	return dirs, nil
}
