package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"io"
	"io/fs"
	"iter"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// tarEntry is one entry of a synthetic package data archive.
type tarEntry struct {
	name string
	typ  byte
	mode int64
	link string
	data string
}

func dataTar(t *testing.T, entries []tarEntry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Size: int64(len(e.data)),
			// Package archives carry their own times and owner names; the layers
			// must not.
			ModTime: time.Unix(1700000000, 0), Uname: "root", Gname: "root"}
		if e.typ != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.data)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func dir(name string) tarEntry { return tarEntry{name: name, typ: tar.TypeDir, mode: 0o755} }
func file(name, data string) tarEntry {
	return tarEntry{name: name, typ: tar.TypeReg, mode: 0o644, data: data}
}
func symlink(name, target string) tarEntry {
	return tarEntry{name: name, typ: tar.TypeSymlink, mode: 0o777, link: target}
}

func fakeDeb(t *testing.T, name, version string, entries []tarEntry) *debPackage {
	t.Helper()
	return &debPackage{
		Name:    name,
		Version: version,
		Arch:    "amd64",
		Control: []byte("Package: " + name + "\nVersion: " + version + "\nArchitecture: amd64\n"),
		File:    name + "_" + version + "_amd64.deb",
		SHA256:  strings.Repeat("0", 64),
		Data:    dataTar(t, entries),
	}
}

// fixtureInput is a small stand-in for a real build: packages shaped like Debian's
// (libraries under /lib, documentation, iconv modules, a hard link, a relative link
// that the /usr merge moves) and text files for binaries.
func fixtureInput(t *testing.T) *buildInput {
	t.Helper()
	debs := map[string]*debPackage{}
	for _, p := range []*debPackage{
		fakeDeb(t, "libc6", "2.36-9+deb12u99", []tarEntry{
			dir("./"), dir("./lib/"), dir("./lib/x86_64-linux-gnu/"), dir("./lib64/"),
			file("./lib/x86_64-linux-gnu/libc.so.6", "libc"),
			file("./lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", "ld.so"),
			symlink("./lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
			symlink("./lib/x86_64-linux-gnu/libc.so.6.alias", "../../usr/share/libc-alias"),
			{name: "./lib/x86_64-linux-gnu/libc-hardlink.so", typ: tar.TypeLink, link: "./lib/x86_64-linux-gnu/libc.so.6"},
			dir("./usr/"), dir("./usr/lib/"), dir("./usr/lib/x86_64-linux-gnu/"), dir("./usr/lib/x86_64-linux-gnu/gconv/"),
			file("./usr/lib/x86_64-linux-gnu/gconv/UTF-16.so", "iconv"),
			dir("./usr/share/"), dir("./usr/share/doc/"), dir("./usr/share/doc/libc6/"),
			file("./usr/share/doc/libc6/copyright", "libc copyright"),
			file("./usr/share/doc/libc6/changelog.Debian.gz", "changes"),
			dir("./usr/share/lintian/"), file("./usr/share/lintian/overrides", "x"),
			file("./usr/share/libc-alias", "alias target"),
		}),
		fakeDeb(t, "libgcc-s1", "12.2.0-14", []tarEntry{
			dir("./"), dir("./lib/"), dir("./lib/x86_64-linux-gnu/"),
			file("./lib/x86_64-linux-gnu/libgcc_s.so.1", "libgcc"),
			dir("./usr/share/doc/"), symlink("./usr/share/doc/libgcc-s1", "gcc-12-base"),
		}),
		fakeDeb(t, "gcc-12-base", "12.2.0-14", []tarEntry{
			dir("./usr/share/doc/gcc-12-base/"),
			file("./usr/share/doc/gcc-12-base/copyright", "gcc copyright"),
			file("./usr/share/doc/gcc-12-base/README", "readme"),
		}),
		fakeDeb(t, "base-files", "12.4", []tarEntry{
			dir("./etc/"), file("./etc/debian_version", "12.99\n"), file("./etc/issue", "Debian\n"),
			symlink("./etc/os-release", "../usr/lib/os-release"),
			file("./usr/lib/os-release", "ID=debian\nVERSION_ID=\"12\"\n"),
			file("./usr/share/common-licenses/GPL-2", "gpl"),
			file("./usr/share/doc/base-files/copyright", "base-files copyright"),
		}),
		fakeDeb(t, "libhwloc15", "2.9.0-1", []tarEntry{
			file("./usr/lib/x86_64-linux-gnu/libhwloc.so.15.6.1", "hwloc"),
			symlink("./usr/lib/x86_64-linux-gnu/libhwloc.so.15", "libhwloc.so.15.6.1"),
		}),
		fakeDeb(t, "libudev1", "252.39-1", []tarEntry{
			file("./usr/lib/x86_64-linux-gnu/libudev.so.1", "udev"),
			file("./usr/share/man/man3/udev.3", "manual"),
		}),
	} {
		debs[p.Name] = p
	}
	return &buildInput{
		version:  "0.1.0",
		revision: "0123456789abcdef0123456789abcdef01234567",
		epoch:    time.Unix(1796111860, 0).UTC(),
		source:   "https://github.com/topodra/topodra",
		licenses: "Apache-2.0",
		registry: "ghcr.io/topodra",
		platform: platforms["amd64"],
		debs:     debs,
		binaries: map[string][]byte{
			"topodra-kubelet-plugin": []byte("plugin"),
			"topodra-controller":     []byte("controller"),
			"kubectl-topodra":        []byte("kubectl plugin"),
		},
		bundled: map[string]*bundledInput{
			"nvidia-cdi-hook": {
				data:      []byte("hook"),
				docs:      map[string][]byte{"LICENSE": []byte("Apache License 2.0"), "THIRD_PARTY_NOTICES.md": []byte("notices")},
				version:   "v1.20.2",
				goVersion: "go1.26.8",
				deps:      []string{"github.com/NVIDIA/go-nvml@v0.13.4-1", "golang.org/x/sys@v0.49.0"},
			},
		},
	}
}

func buildInto(t *testing.T, in *buildInput, out string) *buildRecord {
	t.Helper()
	built, err := assemble(in, images)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := writeOutputs(out, in, built)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// readTree reads every file under dir, by relative path.
func readTree(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		files[rel], err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// Two builds of the same input are byte-identical, whatever the package archives'
// own times and owners; a different SOURCE_DATE_EPOCH gives other digests.
func TestBuildTwiceGivesTheSameBytes(t *testing.T) {
	a, b, c := t.TempDir(), t.TempDir(), t.TempDir()
	recA := buildInto(t, fixtureInput(t), a)
	recB := buildInto(t, fixtureInput(t), b)
	if len(recA.Images) != len(images) {
		t.Fatalf("built %d images, want %d", len(recA.Images), len(images))
	}
	for i := range recA.Images {
		if recA.Images[i].Digest != recB.Images[i].Digest {
			t.Errorf("%s: digest %s, then %s", recA.Images[i].Name, recA.Images[i].Digest, recB.Images[i].Digest)
		}
	}
	filesA, filesB := readTree(t, a), readTree(t, b)
	if len(filesA) != len(filesB) {
		t.Fatalf("%d files, then %d", len(filesA), len(filesB))
	}
	for name, data := range filesA {
		if !bytes.Equal(data, filesB[name]) {
			t.Errorf("%s differs between the two builds", name)
		}
	}
	for _, want := range []string{"digests.txt", "build.json", "topodra-images-0.1.0.oci.tar",
		"topodra-kubelet-plugin-0.1.0.docker.tar", "topodra-controller-0.1.0.docker.tar", "oci/index.json", "oci/oci-layout"} {
		if _, ok := filesA[want]; !ok {
			t.Errorf("no %s in the output", want)
		}
	}

	in := fixtureInput(t)
	in.epoch = in.epoch.Add(time.Second)
	recC := buildInto(t, in, c)
	if recC.Images[0].Digest == recA.Images[0].Digest {
		t.Error("another SOURCE_DATE_EPOCH gave the same digest")
	}

	// A rebuild into the same directory replaces the earlier outputs.
	buildInto(t, fixtureInput(t), a)
	if again := readTree(t, a); len(again) != len(filesA) {
		t.Errorf("a rebuild in place left %d files, want %d", len(again), len(filesA))
	}
}

func TestImageContent(t *testing.T) {
	in := fixtureInput(t)
	built, err := assemble(in, images)
	if err != nil {
		t.Fatal(err)
	}
	plugin, controller := built[0], built[1]
	if plugin.def.name != "topodra-kubelet-plugin" || controller.def.name != "topodra-controller" {
		t.Fatalf("images in the wrong order: %s, %s", plugin.def.name, controller.def.name)
	}
	if plugin.layers[0].Digest != controller.layers[0].Digest {
		t.Error("the base layer differs between the images")
	}
	if plugin.distro != "debian-12" {
		t.Errorf("distro %q, want debian-12", plugin.distro)
	}

	cfg, err := plugin.img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != "0:0" || !slices.Equal(cfg.Config.Entrypoint, []string{"/usr/bin/topodra-kubelet-plugin"}) {
		t.Errorf("plugin user %q, entrypoint %q", cfg.Config.User, cfg.Config.Entrypoint)
	}
	if cfg.Architecture != "amd64" || cfg.OS != "linux" || !cfg.Created.Time.Equal(in.epoch) {
		t.Errorf("platform %s/%s, created %v", cfg.OS, cfg.Architecture, cfg.Created)
	}
	for k, want := range map[string]string{
		"org.opencontainers.image.version":  "0.1.0",
		"org.opencontainers.image.revision": in.revision,
		"org.opencontainers.image.source":   in.source,
		"org.opencontainers.image.created":  "2026-12-01T07:57:40Z",
		"org.opencontainers.image.licenses": "Apache-2.0",
		"org.opencontainers.image.title":    "topodra kubelet plugin",
	} {
		if got := cfg.Config.Labels[k]; got != want {
			t.Errorf("label %s = %q, want %q", k, got, want)
		}
	}
	ccfg, err := controller.img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if ccfg.Config.User != "65532:65532" {
		t.Errorf("controller user %q, want 65532:65532", ccfg.Config.User)
	}
	for _, h := range cfg.History {
		if !h.Created.Time.Equal(in.epoch) {
			t.Errorf("history entry created %v", h.Created)
		}
	}

	// Every layer: sorted, parents first, root-owned unless made otherwise, one time.
	layers, err := plugin.img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	all := map[string]*tar.Header{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		var prev string
		for h := range tarEntries(t, rc) {
			if h.Name <= prev {
				t.Errorf("%s after %s", h.Name, prev)
			}
			prev = h.Name
			if !h.ModTime.Equal(in.epoch) || h.Uname != "" || h.Gname != "" || len(h.Xattrs) > 0 {
				t.Errorf("%s: time %v, owner names %q/%q", h.Name, h.ModTime, h.Uname, h.Gname)
			}
			if h.Uid != 0 && h.Name != "home/nonroot/" {
				t.Errorf("%s: uid %d", h.Name, h.Uid)
			}
			all[strings.TrimSuffix(h.Name, "/")] = h
		}
		rc.Close()
	}
	for _, p := range []string{
		"usr/lib/x86_64-linux-gnu/libc.so.6", "usr/lib/x86_64-linux-gnu/libc-hardlink.so",
		"usr/share/doc/libc6/copyright", "usr/share/doc/gcc-12-base/copyright", "usr/share/doc/libgcc-s1",
		"usr/lib/os-release", "etc/os-release", "etc/debian_version", "etc/passwd", "etc/group",
		"var/lib/dpkg/status.d/libc6", "var/lib/dpkg/status.d/libhwloc15", "tmp", "lib", "lib64",
		"usr/lib/x86_64-linux-gnu/libhwloc.so.15", "usr/bin/topodra-kubelet-plugin",
		"usr/bin/nvidia-cdi-hook", "usr/share/doc/nvidia-container-toolkit/LICENSE",
		"usr/share/doc/nvidia-container-toolkit/THIRD_PARTY_NOTICES.md",
	} {
		if all[p] == nil {
			t.Errorf("no /%s in the plugin image", p)
		}
	}
	for _, p := range []string{
		"lib/x86_64-linux-gnu/libc.so.6", "usr/share/doc/libc6/changelog.Debian.gz", "usr/share/lintian/overrides",
		"usr/lib/x86_64-linux-gnu/gconv/UTF-16.so", "usr/share/man/man3/udev.3", "etc/issue",
		"usr/share/common-licenses/GPL-2", "usr/share/doc/gcc-12-base/README", "usr/bin/topodra-controller",
	} {
		if all[p] != nil {
			t.Errorf("/%s should not be in the plugin image", p)
		}
	}
	if h := all["tmp"]; h == nil || h.Mode != 0o1777 {
		t.Errorf("/tmp: %+v", h)
	}
	if h := all["lib"]; h == nil || h.Linkname != "usr/lib" {
		t.Errorf("/lib: %+v", h)
	}
	// The relative link moved with the /usr merge still reaches its target.
	if h := all["usr/lib/x86_64-linux-gnu/libc.so.6.alias"]; h == nil || h.Linkname != "../../share/libc-alias" {
		t.Errorf("relocated link: %+v", h)
	}
	if h := all["var/lib/dpkg/status.d/libc6"]; h == nil || h.Mode != 0o644 {
		t.Errorf("status entry: %+v", h)
	}
	// The hook in a layer of its own, below topodra's, with its licence files.
	if h := all["usr/bin/nvidia-cdi-hook"]; h == nil || h.Mode != 0o755 {
		t.Errorf("/usr/bin/nvidia-cdi-hook: %+v", h)
	}
	if len(plugin.layers) != 4 || !strings.HasPrefix(plugin.layers[2].Content, "bundled: nvidia-container-toolkit v1.20.2 (Apache-2.0): /usr/bin/nvidia-cdi-hook, ") {
		t.Errorf("plugin layers: %+v", plugin.layers)
	}
	if len(controller.layers) != 2 {
		t.Errorf("controller layers: %+v", controller.layers)
	}
}

func TestDockerTarballAndLayout(t *testing.T) {
	out := t.TempDir()
	rec := buildInto(t, fixtureInput(t), out)

	f, err := os.Open(filepath.Join(out, "topodra-kubelet-plugin-0.1.0.docker.tar"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var manifest []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	for h, contents := range tarEntries(t, f) {
		if h.Name == "manifest.json" {
			if err := json.NewDecoder(contents).Decode(&manifest); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(manifest) != 1 || !slices.Equal(manifest[0].RepoTags, []string{"ghcr.io/topodra/topodra-kubelet-plugin:0.1.0"}) ||
		len(manifest[0].Layers) != 4 {
		t.Errorf("docker manifest.json: %+v", manifest)
	}

	img, err := imageByRef(filepath.Join(out, "oci"), "topodra-controller:0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if d.String() != rec.Images[1].Digest {
		t.Errorf("layout has %s for the controller, build.json %s", d, rec.Images[1].Digest)
	}
	raw, err := os.ReadFile(filepath.Join(out, "oci", "index.json"))
	if err != nil {
		t.Fatal(err)
	}
	var index struct {
		Manifests []struct {
			Platform     *struct{ Architecture, OS string }
			ArtifactType string
			Annotations  map[string]string
		}
	}
	if err := json.Unmarshal(raw, &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 2 {
		t.Fatalf("index.json: %s", raw)
	}
	for i, m := range index.Manifests {
		if m.Platform == nil || m.Platform.Architecture != "amd64" || m.Platform.OS != "linux" || m.ArtifactType != "" {
			t.Errorf("index.json entry %d: %s", i, raw)
		}
	}
	if a := index.Manifests[1].Annotations; a["io.containerd.image.name"] != "ghcr.io/topodra/topodra-controller:0.1.0" ||
		a["org.opencontainers.image.ref.name"] != "topodra-controller:0.1.0" {
		t.Errorf("controller annotations: %v", a)
	}
	if _, err := imageByRef(filepath.Join(out, "oci"), "nothing:0.1.0"); err == nil {
		t.Error("an unknown ref name was found")
	}
	digests, err := os.ReadFile(filepath.Join(out, "digests.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(digests), "ghcr.io/topodra/topodra-controller:0.1.0@"+rec.Images[1].Digest) {
		t.Errorf("digests.txt: %s", digests)
	}
}

func TestUnpack(t *testing.T) {
	out := t.TempDir()
	buildInto(t, fixtureInput(t), out)
	img, err := imageByRef(filepath.Join(out, "oci"), "topodra-kubelet-plugin:0.1.0")
	if err != nil {
		t.Fatal(err)
	}
	dest := filepath.Join(t.TempDir(), "rootfs")
	if err := unpack(img, dest); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{
		"usr/bin/topodra-kubelet-plugin":           "plugin",
		"lib/x86_64-linux-gnu/libc.so.6":           "libc",
		"lib64/ld-linux-x86-64.so.2":               "", // absolute link: checked below
		"usr/lib/x86_64-linux-gnu/libhwloc.so.15":  "hwloc",
		"etc/os-release":                           "ID=debian\nVERSION_ID=\"12\"\n",
		"usr/lib/x86_64-linux-gnu/libc.so.6.alias": "alias target",
		"usr/bin/nvidia-cdi-hook":                  "hook",
	} {
		if want == "" {
			continue
		}
		got, err := os.ReadFile(filepath.Join(dest, p))
		if err != nil || string(got) != want {
			t.Errorf("/%s: %q, %v; want %q", p, got, err, want)
		}
	}
	if link, err := os.Readlink(filepath.Join(dest, "usr/lib64/ld-linux-x86-64.so.2")); err != nil ||
		link != "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2" {
		t.Errorf("ld.so link: %q, %v", link, err)
	}
	for _, b := range []string{"usr/bin/topodra-kubelet-plugin", "usr/bin/nvidia-cdi-hook"} {
		fi, err := os.Stat(filepath.Join(dest, b))
		if err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("/%s: %v, %v", b, fi.Mode(), err)
		}
	}
	if fi, err := os.Stat(filepath.Join(dest, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("/tmp: %v, %v", fi.Mode(), err)
	}
	if err := unpack(img, dest); err == nil {
		t.Error("unpacking into a non-empty directory worked")
	}
}

// checkELF on a real dynamic binary of this machine, with the files ld.so would load
// copied into a fake image: complete, then without libc.
func TestCheckELF(t *testing.T) {
	if runtime.GOOS != "linux" || runtime.GOARCH != "amd64" {
		t.Skip("needs an amd64 Linux machine")
	}
	bin := "/bin/sh"
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Skip(err)
	}
	f, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		t.Skip("/bin/sh is not ELF")
	}
	needed, err := f.ImportedLibraries()
	f.Close()
	if err != nil || len(needed) == 0 {
		t.Skip("/bin/sh is not dynamically linked")
	}
	tree := imageTree{"usr/bin/sh": {path: "usr/bin/sh", typ: tar.TypeReg, data: data, origin: "test"}}
	var add func(soname string)
	add = func(soname string) {
		for _, d := range []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"} {
			raw, err := os.ReadFile(filepath.Join(d, soname))
			if err != nil {
				continue
			}
			p := "usr/lib/x86_64-linux-gnu/" + soname
			if tree[p] != nil {
				return
			}
			tree[p] = &node{path: p, typ: tar.TypeReg, data: raw, origin: "pkg-" + soname}
			lf, err := elf.NewFile(bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			more, _ := lf.ImportedLibraries()
			lf.Close()
			for _, m := range more {
				add(m)
			}
			return
		}
		t.Skipf("%s not found on this machine", soname)
	}
	for _, n := range needed {
		add(n)
	}
	add("ld-linux-x86-64.so.2")
	tree["lib64"] = &node{path: "lib64", typ: tar.TypeSymlink, link: "usr/lib64"}
	tree["usr/lib64/ld-linux-x86-64.so.2"] = &node{path: "usr/lib64/ld-linux-x86-64.so.2", typ: tar.TypeSymlink,
		link: "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"}

	libs, err := checkELF(tree, "usr/bin/sh", platforms["amd64"])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(libs, func(l runtimeLib) bool { return l.Soname == "libc.so.6" && l.Package == "pkg-libc.so.6" }) {
		t.Errorf("libc.so.6 not among %+v", libs)
	}
	if _, err := checkELF(tree, "usr/bin/sh", platforms["arm64"]); err == nil {
		t.Error("an amd64 binary passed as arm64")
	}
	delete(tree, "usr/lib/x86_64-linux-gnu/libc.so.6")
	if _, err := checkELF(tree, "usr/bin/sh", platforms["amd64"]); err == nil || !strings.Contains(err.Error(), "libc.so.6") {
		t.Errorf("without libc: %v", err)
	}
}

func TestRuntimeCratesAndSBOM(t *testing.T) {
	md := &cargoMetadata{}
	raw := `{
	  "packages": [
	    {"id": "path+file:///src/kubelet-plugin#topodra-kubelet-plugin@0.1.0", "name": "topodra-kubelet-plugin", "version": "0.1.0", "license": "Apache-2.0", "source": null, "targets": [{"kind": ["bin"]}]},
	    {"id": "path+file:///src/controller#topodra-controller@0.1.0", "name": "topodra-controller", "version": "0.1.0", "license": "Apache-2.0", "source": null, "targets": [{"kind": ["bin"]}]},
	    {"id": "registry+https://github.com/rust-lang/crates.io-index#serde@1.0.0", "name": "serde", "version": "1.0.0", "license": "MIT/Apache-2.0", "source": "registry+https://github.com/rust-lang/crates.io-index", "targets": [{"kind": ["lib"]}]},
	    {"id": "registry+https://github.com/rust-lang/crates.io-index#serde_derive@1.0.0", "name": "serde_derive", "version": "1.0.0", "license": "MIT OR Apache-2.0", "source": "registry+https://github.com/rust-lang/crates.io-index", "targets": [{"kind": ["proc-macro"]}]},
	    {"id": "registry+https://github.com/rust-lang/crates.io-index#syn@2.0.0", "name": "syn", "version": "2.0.0", "license": "MIT OR Apache-2.0", "source": "registry+https://github.com/rust-lang/crates.io-index", "targets": [{"kind": ["lib"]}]},
	    {"id": "registry+https://github.com/rust-lang/crates.io-index#proptest@1.0.0", "name": "proptest", "version": "1.0.0", "license": "MIT OR Apache-2.0", "source": "registry+https://github.com/rust-lang/crates.io-index", "targets": [{"kind": ["lib"]}]},
	    {"id": "registry+https://github.com/rust-lang/crates.io-index#cc@1.0.0", "name": "cc", "version": "1.0.0", "license": "MIT OR Apache-2.0", "source": "registry+https://github.com/rust-lang/crates.io-index", "targets": [{"kind": ["lib"]}]}
	  ],
	  "workspace_members": ["path+file:///src/kubelet-plugin#topodra-kubelet-plugin@0.1.0", "path+file:///src/controller#topodra-controller@0.1.0"],
	  "resolve": {"nodes": [
	    {"id": "path+file:///src/kubelet-plugin#topodra-kubelet-plugin@0.1.0", "deps": [
	      {"pkg": "registry+https://github.com/rust-lang/crates.io-index#serde@1.0.0", "dep_kinds": [{"kind": null}]},
	      {"pkg": "registry+https://github.com/rust-lang/crates.io-index#proptest@1.0.0", "dep_kinds": [{"kind": "dev"}]},
	      {"pkg": "registry+https://github.com/rust-lang/crates.io-index#cc@1.0.0", "dep_kinds": [{"kind": "build"}]}
	    ]},
	    {"id": "path+file:///src/controller#topodra-controller@0.1.0", "deps": []},
	    {"id": "registry+https://github.com/rust-lang/crates.io-index#serde@1.0.0", "deps": [
	      {"pkg": "registry+https://github.com/rust-lang/crates.io-index#serde_derive@1.0.0", "dep_kinds": [{"kind": null}]}
	    ]},
	    {"id": "registry+https://github.com/rust-lang/crates.io-index#serde_derive@1.0.0", "deps": [
	      {"pkg": "registry+https://github.com/rust-lang/crates.io-index#syn@2.0.0", "dep_kinds": [{"kind": null}]}
	    ]}
	  ]}
	}`
	if err := json.Unmarshal([]byte(raw), md); err != nil {
		t.Fatal(err)
	}
	ids, err := runtimeCrates(md, "topodra-kubelet-plugin")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"path+file:///src/kubelet-plugin#topodra-kubelet-plugin@0.1.0",
		"registry+https://github.com/rust-lang/crates.io-index#serde@1.0.0",
	}
	if !slices.Equal(ids, want) {
		t.Errorf("runtime crates %q, want %q", ids, want)
	}

	out := t.TempDir()
	rec := buildInto(t, fixtureInput(t), out)
	doc, err := makeSBOM(rec, md)
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"spdxVersion":"SPDX-2.3"`,
		`"licenseDeclared":"MIT OR Apache-2.0"`,
		`"referenceLocator":"pkg:cargo/serde@1.0.0"`,
		`"referenceLocator":"pkg:deb/debian/libc6@2.36-9+deb12u99?arch=amd64\u0026distro=debian-12"`,
		`"checksumValue":"` + strings.TrimPrefix(rec.Images[0].Digest, "sha256:") + `"`,
		`"name":"github.com/NVIDIA/nvidia-container-toolkit","versionInfo":"v1.20.2","downloadLocation":"git+https://github.com/NVIDIA/nvidia-container-toolkit@v1.20.2"`,
		`"licenseDeclared":"Apache-2.0","copyrightText":"NOASSERTION","supplier":"Organization: NVIDIA Corporation"`,
		`"referenceLocator":"pkg:golang/github.com/NVIDIA/nvidia-container-toolkit@v1.20.2"`,
		`"referenceLocator":"pkg:golang/github.com/NVIDIA/go-nvml@v0.13.4-1"`,
	} {
		if !strings.Contains(string(js), want) {
			t.Errorf("SBOM lacks %s", want)
		}
	}
	if strings.Contains(string(js), "file:///") || strings.Contains(string(js), "proptest") || strings.Contains(string(js), "syn") {
		t.Error("SBOM names a local path or a crate that is not in the binaries")
	}
}

func TestRelocateLink(t *testing.T) {
	for _, c := range []struct{ from, target, want string }{
		{"lib/x86_64-linux-gnu/libfoo.so.1", "libfoo.so.1.2", "libfoo.so.1.2"},
		{"lib/x86_64-linux-gnu/a", "../../usr/lib/b", "../b"},
		{"lib64/ld.so", "/lib/x86_64-linux-gnu/ld.so", "/lib/x86_64-linux-gnu/ld.so"},
		{"usr/share/doc/libgcc-s1", "gcc-12-base", "gcc-12-base"},
	} {
		if got := relocateLink(c.from, usrMerged(c.from), c.target); got != c.want {
			t.Errorf("%s -> %s: %q, want %q", c.from, c.target, got, c.want)
		}
	}
}

// tarEntries yields each entry of the tar stream r with a reader of its contents;
// a broken stream fails the test.
func tarEntries(t *testing.T, r io.Reader) iter.Seq2[*tar.Header, io.Reader] {
	t.Helper()
	return func(yield func(*tar.Header, io.Reader) bool) {
		tr := tar.NewReader(r)
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !yield(h, tr) {
				return
			}
		}
	}
}

// The version of a bundled binary comes from its own Go build information: this
// test binary stands in for one, with go-containerregistry as the module.
func TestBundledVersionFromBuildInfo(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	version, goVersion, deps, err := goModules(data, "github.com/google/go-containerregistry")
	if err != nil {
		t.Fatal(err)
	}
	if version != "v0.22.1" || !strings.HasPrefix(goVersion, "go1.") {
		t.Errorf("version %q, Go %q", version, goVersion)
	}
	if !slices.ContainsFunc(deps, func(d string) bool { return strings.HasPrefix(d, "github.com/klauspost/compress@v") }) ||
		slices.ContainsFunc(deps, func(d string) bool { return strings.HasPrefix(d, "github.com/google/go-containerregistry@") }) {
		t.Errorf("deps %v", deps)
	}
	if _, _, _, err := goModules(data, "github.com/NVIDIA/nvidia-container-toolkit"); err == nil ||
		!strings.Contains(err.Error(), "not built from github.com/NVIDIA/nvidia-container-toolkit") {
		t.Errorf("another module: %v", err)
	}
	if _, _, _, err := goModules([]byte("#!/bin/sh\n"), "x"); err == nil {
		t.Error("a script has build information")
	}

	// From a tools cache entry: bin/ and share/, and a clear error without one.
	dir := t.TempDir()
	for _, d := range []string{"bin", "share"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "nvidia-cdi-hook"), data, 0o755); err != nil {
		t.Fatal(err)
	}
	plugin, _ := findImage("topodra-kubelet-plugin")
	if _, err := loadBundled([]imageDef{plugin}, map[string]string{}); err == nil || !strings.Contains(err.Error(), "-tool nvidia-ctk=DIR") {
		t.Errorf("without -tool: %v", err)
	}
	if _, err := loadBundled([]imageDef{plugin}, map[string]string{"nvidia-ctk": dir}); err == nil ||
		!strings.Contains(err.Error(), "not built from github.com/NVIDIA/nvidia-container-toolkit") {
		t.Errorf("the wrong binary: %v", err)
	}
	controller, _ := findImage("topodra-controller")
	if got, err := loadBundled([]imageDef{controller}, nil); err != nil || len(got) != 0 {
		t.Errorf("controller: %v, %v", got, err)
	}
	if !slices.Equal(bundledTools(), []string{"nvidia-ctk"}) {
		t.Errorf("bundled tools %v", bundledTools())
	}
}
