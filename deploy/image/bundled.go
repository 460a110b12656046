package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strings"
)

// bundledBinary is another project's program that an image carries beside topodra's
// own: a Go binary that tests/tools/build.sh builds from its pinned module into the
// tools cache, installed as /usr/bin/<name>, with the project's licence files under
// /usr/share/doc/<project>/ (as Debian packages ship their copyright files).
type bundledBinary struct {
	name string
	// tool is the tests/tools/build.sh tool that builds it: its cache entry has
	// bin/<name> and share/<docs>.
	tool string
	// module is the Go module the binary comes from; its version is read from the
	// binary's own build information, so it is what was built, not what was meant.
	module   string
	project  string
	license  string
	supplier string
	homepage string
	docs     []string
}

// bundledInput is one bundled binary as found in its tool's cache entry.
type bundledInput struct {
	data []byte
	docs map[string][]byte
	// version is the module's version in the binary's build information.
	version   string
	goVersion string
	// deps are the other modules linked in, as path@version.
	deps []string
}

// goModules reads the Go build information of a binary: the version of module in it
// (the main module, or a dependency, as when it is built from a wrapper module) and
// every other module linked in.
func goModules(data []byte, module string) (version, goVersion string, deps []string, err error) {
	info, err := buildinfo.Read(bytes.NewReader(data))
	if err != nil {
		return "", "", nil, fmt.Errorf("no Go build information: %w", err)
	}
	mods := append([]*debug.Module{&info.Main}, info.Deps...)
	for _, m := range mods {
		if m.Replace != nil {
			m = m.Replace
		}
		if m.Path == module {
			version = m.Version
			continue
		}
		if m.Path == "" || m.Version == "" || m.Version == "(devel)" {
			continue // the wrapper module the tool is built from
		}
		deps = append(deps, m.Path+"@"+m.Version)
	}
	if version == "" {
		return "", "", nil, fmt.Errorf("not built from %s (its build information names no such module)", module)
	}
	slices.Sort(deps)
	return version, info.GoVersion, deps, nil
}

// loadBundled reads the bundled binaries of defs from the tools cache entries in
// toolDirs (tool name to directory).
func loadBundled(defs []imageDef, toolDirs map[string]string) (map[string]*bundledInput, error) {
	out := map[string]*bundledInput{}
	for _, d := range defs {
		for _, b := range d.bundled {
			if _, ok := out[b.name]; ok {
				continue
			}
			dir, ok := toolDirs[b.tool]
			if !ok {
				return nil, fmt.Errorf("%s carries %s: pass -tool %s=DIR (tests/tools/build.sh %s builds it)", d.name, b.name, b.tool, b.tool)
			}
			data, err := os.ReadFile(filepath.Join(dir, "bin", b.name))
			if err != nil {
				return nil, err
			}
			in := &bundledInput{data: data, docs: map[string][]byte{}}
			if in.version, in.goVersion, in.deps, err = goModules(data, b.module); err != nil {
				return nil, fmt.Errorf("%s/bin/%s: %w", dir, b.name, err)
			}
			for _, doc := range b.docs {
				if in.docs[doc], err = os.ReadFile(filepath.Join(dir, "share", doc)); err != nil {
					return nil, err
				}
			}
			out[b.name] = in
		}
	}
	return out, nil
}

// bundledLayer is the layer of def's bundled binaries and their licence files.
func bundledLayer(in *buildInput, def imageDef) (*layerFS, string, error) {
	l := newLayerFS()
	var parts []string
	for _, b := range def.bundled {
		bin, ok := in.bundled[b.name]
		if !ok {
			return nil, "", fmt.Errorf("%s: no bundled binary %s", def.name, b.name)
		}
		origin := b.project + " " + bin.version
		if err := l.add(&node{path: "usr/bin/" + b.name, typ: tar.TypeReg, mode: 0o755, data: bin.data, origin: origin}); err != nil {
			return nil, "", err
		}
		files := []string{"/usr/bin/" + b.name}
		for _, doc := range b.docs {
			p := "usr/share/doc/" + b.project + "/" + doc
			if err := l.add(&node{path: p, typ: tar.TypeReg, mode: 0o644, data: bin.docs[doc], origin: origin}); err != nil {
				return nil, "", err
			}
			files = append(files, "/"+p)
		}
		parts = append(parts, origin+" ("+b.license+"): "+strings.Join(files, ", "))
	}
	return l, strings.Join(parts, "; "), nil
}

// bundledRecord is a bundled binary in build.json.
type bundledRecord struct {
	Path      string   `json:"path"`
	SHA256    string   `json:"sha256"`
	Module    string   `json:"module"`
	Version   string   `json:"version"`
	License   string   `json:"license"`
	GoVersion string   `json:"go_version"`
	Docs      []string `json:"docs"`
	Deps      []string `json:"go_modules"`
	// Tool is the tests/tools/build.sh tool that built it.
	Tool string `json:"tool"`
}

func (in *buildInput) bundledRecords(def imageDef) []bundledRecord {
	var out []bundledRecord
	for _, b := range def.bundled {
		bin := in.bundled[b.name]
		sum := sha256.Sum256(bin.data)
		r := bundledRecord{Path: "/usr/bin/" + b.name, SHA256: hex.EncodeToString(sum[:]), Module: b.module, Version: bin.version,
			License: b.license, GoVersion: bin.goVersion, Deps: bin.deps, Tool: b.tool}
		for _, doc := range b.docs {
			r.Docs = append(r.Docs, "/usr/share/doc/"+b.project+"/"+doc)
		}
		out = append(out, r)
	}
	return out
}

// findBundled is the definition of the bundled binary at path (/usr/bin/<name>).
func findBundled(path string) (bundledBinary, bool) {
	for _, im := range images {
		for _, b := range im.bundled {
			if "/usr/bin/"+b.name == path {
				return b, true
			}
		}
	}
	return bundledBinary{}, false
}
