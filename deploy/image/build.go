package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
)

// buildInput is everything an image build depends on. The same input gives the same
// bytes: layers, configs, manifests, the layout and the tarballs.
type buildInput struct {
	version  string
	revision string
	// epoch is SOURCE_DATE_EPOCH: every file time and the images' creation time.
	epoch    time.Time
	source   string
	licenses string
	// registry prefixes the image names in references: ghcr.io/topodra.
	registry string
	platform platform
	debs     map[string]*debPackage
	// binaries are the release binaries by file name.
	binaries map[string][]byte
	// bundled are other projects' binaries by file name (bundled.go).
	bundled map[string]*bundledInput
}

// builtImage is one assembled image and what went into it.
type builtImage struct {
	def       imageDef
	img       v1.Image
	reference string
	layers    []layerRecord
	packages  []*debPackage
	libs      []runtimeLib
	// distro is ID-VERSION_ID of the image's os-release (debian-12), for package URLs.
	distro string
}

type layerRecord struct {
	Digest  string `json:"digest"`
	DiffID  string `json:"diff_id"`
	Size    int64  `json:"size"`
	Content string `json:"content"`
}

// etc files of the base layer. "nonroot" is the user non-root images run as; its
// number is the one the chart's controller securityContext names.
const (
	etcPasswd = "root:x:0:0:root:/root:/usr/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin\n"
	etcGroup       = "root:x:0:\nnonroot:x:65532:\n"
	etcNsswitch    = "passwd: files\ngroup: files\nhosts: files dns\n"
	nonrootID      = 65532
	statusDir      = "var/lib/dpkg/status.d/"
	imageEnvPath   = "PATH=/usr/bin"
	labelPrefix    = "org.opencontainers.image."
	refNameKey     = "org.opencontainers.image.ref.name"
	containerdName = "io.containerd.image.name"
)

// addPackages puts the packages' files and their dpkg status entries into l.
func addPackages(l *layerFS, in *buildInput, rules []pkgRule) ([]*debPackage, error) {
	var used []*debPackage
	for _, rule := range rules {
		p, ok := in.debs[rule.name]
		if !ok {
			return nil, fmt.Errorf("no .deb given for package %s", rule.name)
		}
		if p.Arch != in.platform.arch && p.Arch != "all" {
			return nil, fmt.Errorf("%s is a %s package, the images are %s", p.File, p.Arch, in.platform.arch)
		}
		if err := addPackageTar(l, rule, bytes.NewReader(p.Data)); err != nil {
			return nil, err
		}
		control := p.Control
		if !bytes.HasSuffix(control, []byte("\n")) {
			control = append(slices.Clone(control), '\n')
		}
		if err := l.add(&node{path: statusDir + p.Name, typ: tar.TypeReg, mode: 0o644, data: control, origin: p.Name}); err != nil {
			return nil, err
		}
		used = append(used, p)
	}
	return used, nil
}

// baseLayer is glibc, libgcc, os-release, the user database and /tmp, in a /usr-merged
// tree. It is the same in every image, so a registry stores it once.
func baseLayer(in *buildInput) (*layerFS, []*debPackage, error) {
	l := newLayerFS()
	used, err := addPackages(l, in, basePackages)
	if err != nil {
		return nil, nil, err
	}
	for _, f := range []struct{ path, data string }{
		{"etc/passwd", etcPasswd}, {"etc/group", etcGroup}, {"etc/nsswitch.conf", etcNsswitch},
	} {
		if err := l.add(&node{path: f.path, typ: tar.TypeReg, mode: 0o644, data: []byte(f.data), origin: "topodra"}); err != nil {
			return nil, nil, err
		}
	}
	l.addExplicitDir(&node{path: "tmp", typ: tar.TypeDir, mode: 0o1777, origin: "topodra"})
	l.addExplicitDir(&node{path: "root", typ: tar.TypeDir, mode: 0o700, origin: "topodra"})
	l.addExplicitDir(&node{path: "home/nonroot", typ: tar.TypeDir, mode: 0o700, uid: nonrootID, gid: nonrootID, origin: "topodra"})
	for _, link := range mergedLinks {
		usr := "usr/" + link
		present := false
		for p := range l.nodes {
			if strings.HasPrefix(p, usr+"/") {
				present = true
				break
			}
		}
		// /bin is there for the binaries of the layers above; the others only
		// where the packages have something under them.
		if present || link == "bin" {
			if err := l.add(&node{path: link, typ: tar.TypeSymlink, mode: 0o777, link: usr, origin: "topodra"}); err != nil {
				return nil, nil, err
			}
		}
	}
	return l, used, nil
}

// assemble builds the images of defs from in.
func assemble(in *buildInput, defs []imageDef) ([]builtImage, error) {
	base, basePkgs, err := baseLayer(in)
	if err != nil {
		return nil, fmt.Errorf("base layer: %w", err)
	}
	layers := newLayerCache(in.epoch)
	var out []builtImage
	for _, def := range defs {
		tree := imageTree{}
		tree.merge(base)
		type part struct {
			fs      *layerFS
			content string
		}
		parts := []part{{base, "base: " + pkgList(basePkgs) + ", /etc/passwd, /etc/group, /etc/nsswitch.conf"}}
		pkgs := slices.Clone(basePkgs)
		if len(def.packages) > 0 {
			l := newLayerFS()
			used, err := addPackages(l, in, def.packages)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", def.name, err)
			}
			tree.merge(l)
			parts = append(parts, part{l, "libraries: " + pkgList(used)})
			pkgs = append(pkgs, used...)
		}
		if len(def.bundled) > 0 {
			l, content, err := bundledLayer(in, def)
			if err != nil {
				return nil, err
			}
			tree.merge(l)
			parts = append(parts, part{l, "bundled: " + content})
		}
		app := newLayerFS()
		for _, b := range def.binaries {
			data, ok := in.binaries[b]
			if !ok {
				return nil, fmt.Errorf("%s: no binary %s", def.name, b)
			}
			if err := app.add(&node{path: "usr/bin/" + b, typ: tar.TypeReg, mode: 0o755, data: data, origin: "topodra"}); err != nil {
				return nil, err
			}
		}
		tree.merge(app)
		parts = append(parts, part{app, "topodra " + in.version + ": /usr/bin/" + strings.Join(def.binaries, ", /usr/bin/")})

		var libs []runtimeLib
		var programs []string
		programs = append(programs, def.binaries...)
		for _, b := range def.bundled {
			programs = append(programs, b.name)
		}
		for _, b := range programs {
			found, err := checkELF(tree, "usr/bin/"+b, in.platform)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", def.name, err)
			}
			for _, lib := range found {
				if !slices.Contains(libs, lib) {
					libs = append(libs, lib)
				}
			}
		}
		slices.SortFunc(libs, func(a, b runtimeLib) int { return strings.Compare(a.Soname, b.Soname) })

		img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
		var records []layerRecord
		for _, p := range parts {
			layer, rec, err := layers.get(p.fs, p.content)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", def.name, err)
			}
			records = append(records, rec)
			img, err = mutate.Append(img, mutate.Addendum{
				Layer:     layer,
				MediaType: types.OCILayer,
				History: v1.History{
					Created:   v1.Time{Time: in.epoch},
					CreatedBy: "topodra deploy/image",
					Comment:   p.content,
				},
			})
			if err != nil {
				return nil, err
			}
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		cfg = cfg.DeepCopy()
		cfg.Architecture = in.platform.arch
		cfg.OS = "linux"
		if in.platform.arch == "arm64" {
			cfg.Variant = "v8"
		}
		cfg.Created = v1.Time{Time: in.epoch}
		labels := in.labels(def)
		cfg.Config = v1.Config{
			Entrypoint: []string{"/usr/bin/" + def.binaries[0]},
			Env:        []string{imageEnvPath},
			User:       def.user,
			WorkingDir: "/",
			Labels:     labels,
		}
		if img, err = mutate.ConfigFile(img, cfg); err != nil {
			return nil, err
		}
		// The same as annotations of the manifest: registries show those.
		img = mutate.Annotations(img, labels).(v1.Image)
		out = append(out, builtImage{
			def:       def,
			img:       img,
			reference: in.reference(def),
			layers:    records,
			packages:  pkgs,
			libs:      libs,
			distro:    osRelease(tree),
		})
	}
	return out, nil
}

func (in *buildInput) labels(def imageDef) map[string]string {
	return map[string]string{
		labelPrefix + "title":       def.title,
		labelPrefix + "description": def.description,
		labelPrefix + "source":      in.source,
		labelPrefix + "url":         in.source,
		labelPrefix + "version":     in.version,
		labelPrefix + "revision":    in.revision,
		labelPrefix + "created":     in.epoch.UTC().Format(time.RFC3339),
		labelPrefix + "licenses":    in.licenses,
	}
}

func (in *buildInput) reference(def imageDef) string {
	return in.registry + "/" + def.name + ":" + in.version
}

// osRelease is "<ID>-<VERSION_ID>" from the image's os-release, "" without one.
func osRelease(t imageTree) string {
	n := t.resolve("etc/os-release")
	if n == nil || n.typ != tar.TypeReg {
		return ""
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(n.data), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			fields[k] = strings.Trim(v, `"`)
		}
	}
	if fields["ID"] == "" || fields["VERSION_ID"] == "" {
		return ""
	}
	return fields["ID"] + "-" + fields["VERSION_ID"]
}

func pkgList(pkgs []*debPackage) string {
	var s []string
	for _, p := range pkgs {
		s = append(s, p.Name+" "+p.Version)
	}
	return strings.Join(s, ", ")
}

// layerCache compresses each distinct layer once: the base layer (and a library
// layer two images share) is one blob.
type layerCache struct {
	mtime time.Time
	byTar map[[32]byte]cachedLayer
}

type cachedLayer struct {
	layer v1.Layer
	rec   layerRecord
}

func newLayerCache(mtime time.Time) *layerCache {
	return &layerCache{mtime: mtime, byTar: map[[32]byte]cachedLayer{}}
}

func (c *layerCache) get(l *layerFS, content string) (v1.Layer, layerRecord, error) {
	raw, err := writeLayer(l, c.mtime)
	if err != nil {
		return nil, layerRecord{}, err
	}
	key := sha256.Sum256(raw)
	if hit, ok := c.byTar[key]; ok {
		return hit.layer, hit.rec, nil
	}
	// Compressed here rather than by go-containerregistry, so that the bytes depend
	// on the pinned compress module and not on the Go toolchain's compress/flate.
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, layerRecord{}, err
	}
	if _, err := zw.Write(raw); err != nil {
		return nil, layerRecord{}, err
	}
	if err := zw.Close(); err != nil {
		return nil, layerRecord{}, err
	}
	blob := gz.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(blob)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, layerRecord{}, err
	}
	digest, err := layer.Digest()
	if err != nil {
		return nil, layerRecord{}, err
	}
	diffID, err := layer.DiffID()
	if err != nil {
		return nil, layerRecord{}, err
	}
	rec := layerRecord{Digest: digest.String(), DiffID: diffID.String(), Size: int64(len(blob)), Content: content}
	c.byTar[key] = cachedLayer{layer, rec}
	return layer, rec, nil
}

// buildRecord is build.json: what was built from what, for the SBOM, the release and
// whoever checks an image against its sources.
type buildRecord struct {
	Version  string        `json:"version"`
	Revision string        `json:"revision"`
	Created  string        `json:"created"`
	Epoch    int64         `json:"source_date_epoch"`
	Source   string        `json:"source"`
	Platform string        `json:"platform"`
	Distro   string        `json:"distro,omitempty"`
	Layout   string        `json:"oci_layout"`
	Images   []imageRecord `json:"images"`
}

type imageRecord struct {
	Name             string          `json:"name"`
	Reference        string          `json:"reference"`
	RefName          string          `json:"oci_ref_name"`
	Digest           string          `json:"digest"`
	ConfigDigest     string          `json:"config_digest"`
	DockerTar        string          `json:"docker_tar"`
	User             string          `json:"user"`
	Entrypoint       []string        `json:"entrypoint"`
	CompressedSize   int64           `json:"compressed_size"`
	UncompressedSize int64           `json:"uncompressed_size"`
	Layers           []layerRecord   `json:"layers"`
	Packages         []packageRecord `json:"packages"`
	Binaries         []binaryRecord  `json:"binaries"`
	Bundled          []bundledRecord `json:"bundled,omitempty"`
	RuntimeLibraries []runtimeLib    `json:"runtime_libraries"`
}

type packageRecord struct {
	Name         string `json:"name"`
	Version      string `json:"version"`
	Architecture string `json:"architecture"`
	File         string `json:"file"`
	SHA256       string `json:"sha256"`
}

type binaryRecord struct {
	Path   string `json:"path"`
	SHA256 string `json:"sha256"`
}

// The files build writes into its output directory, besides the layout.
func dockerTarName(image, version string) string { return image + "-" + version + ".docker.tar" }
func ociTarName(version string) string           { return "topodra-images-" + version + ".oci.tar" }

const (
	layoutDir  = "oci"
	recordName = "build.json"
	digestName = "digests.txt"
)

// refName is an image's org.opencontainers.image.ref.name in the layout.
func refName(image, version string) string { return image + ":" + version }

// writeOutputs writes the layout, the tarballs and the records into out, replacing
// what an earlier build left there.
func writeOutputs(out string, in *buildInput, built []builtImage) (*buildRecord, error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	old, _ := filepath.Glob(filepath.Join(out, "*.docker.tar"))
	more, _ := filepath.Glob(filepath.Join(out, "*.oci.tar"))
	for _, p := range slices.Concat(old, more, []string{filepath.Join(out, layoutDir), filepath.Join(out, recordName), filepath.Join(out, digestName)}) {
		if err := os.RemoveAll(p); err != nil {
			return nil, err
		}
	}
	lp, err := layout.Write(filepath.Join(out, layoutDir), empty.Index)
	if err != nil {
		return nil, err
	}
	rec := &buildRecord{
		Version:  in.version,
		Revision: in.revision,
		Created:  in.epoch.UTC().Format(time.RFC3339),
		Epoch:    in.epoch.Unix(),
		Source:   in.source,
		Platform: "linux/" + in.platform.arch,
		Layout:   layoutDir,
	}
	if len(built) > 0 {
		rec.Distro = built[0].distro
	}
	var digests strings.Builder
	for _, b := range built {
		ref, err := name.NewTag(b.reference, name.StrictValidation)
		if err != nil {
			return nil, err
		}
		if err := lp.WriteImage(b.img); err != nil {
			return nil, err
		}
		digest, err := b.img.Digest()
		if err != nil {
			return nil, err
		}
		size, err := b.img.Size()
		if err != nil {
			return nil, err
		}
		// The index entry names the platform, which runtimes importing the layout
		// (ctr images import) select by, and no artifactType: these are images.
		platform := &v1.Platform{OS: "linux", Architecture: in.platform.arch}
		if in.platform.arch == "arm64" {
			platform.Variant = "v8"
		}
		if err := lp.AppendDescriptor(v1.Descriptor{
			MediaType: types.OCIManifestSchema1,
			Size:      size,
			Digest:    digest,
			Platform:  platform,
			Annotations: map[string]string{
				refNameKey:     refName(b.def.name, in.version),
				containerdName: b.reference,
			},
		}); err != nil {
			return nil, err
		}
		tarName := dockerTarName(b.def.name, in.version)
		if err := tarball.WriteToFile(filepath.Join(out, tarName), ref, b.img); err != nil {
			return nil, err
		}
		cfgName, err := b.img.ConfigName()
		if err != nil {
			return nil, err
		}
		ir := imageRecord{
			Name:             b.def.name,
			Reference:        b.reference,
			RefName:          refName(b.def.name, in.version),
			Digest:           digest.String(),
			ConfigDigest:     cfgName.String(),
			DockerTar:        tarName,
			User:             b.def.user,
			Entrypoint:       []string{"/usr/bin/" + b.def.binaries[0]},
			Layers:           b.layers,
			RuntimeLibraries: b.libs,
		}
		for _, l := range b.layers {
			ir.CompressedSize += l.Size
		}
		layers, err := b.img.Layers()
		if err != nil {
			return nil, err
		}
		for _, l := range layers {
			n, err := uncompressedSize(l)
			if err != nil {
				return nil, err
			}
			ir.UncompressedSize += n
		}
		for _, p := range b.packages {
			ir.Packages = append(ir.Packages, packageRecord{Name: p.Name, Version: p.Version, Architecture: p.Arch, File: p.File, SHA256: p.SHA256})
		}
		for _, bin := range b.def.binaries {
			sum := sha256.Sum256(in.binaries[bin])
			ir.Binaries = append(ir.Binaries, binaryRecord{Path: "/usr/bin/" + bin, SHA256: hex.EncodeToString(sum[:])})
		}
		ir.Bundled = in.bundledRecords(b.def)
		rec.Images = append(rec.Images, ir)
		fmt.Fprintf(&digests, "%s@%s\n", b.reference, digest)
	}
	if err := writeDirTar(filepath.Join(out, layoutDir), filepath.Join(out, ociTarName(in.version)), in.epoch); err != nil {
		return nil, err
	}
	js, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(out, recordName), append(js, '\n'), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(out, digestName), []byte(digests.String()), 0o644); err != nil {
		return nil, err
	}
	return rec, nil
}

func uncompressedSize(l v1.Layer) (int64, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	return io.Copy(io.Discard, rc)
}

// writeDirTar archives a directory of plain files (the OCI layout) the way layers
// are written: sorted, root-owned, one time.
func writeDirTar(dir, file string, mtime time.Time) error {
	var paths []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	})
	if err != nil {
		return err
	}
	slices.Sort(paths)
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(f)
	for _, p := range paths {
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: mtime, Mode: 0o644, Format: tar.FormatPAX}
		switch {
		case fi.IsDir():
			h.Typeflag, h.Mode, h.Name = tar.TypeDir, 0o755, h.Name+"/"
		case fi.Mode().IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, fi.Size()
		default:
			return fmt.Errorf("%s: not a file or directory", p)
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg {
			src, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, src)
			src.Close()
			if err != nil {
				return err
			}
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func cmdBuild(args []string) error {
	fs := flag.NewFlagSet("build", flag.ContinueOnError)
	out := fs.String("out", "", "output directory (target/image)")
	binDir := fs.String("bin", "", "directory of the release binaries (target/release)")
	var debFiles, only, tools multiFlag
	fs.Var(&debFiles, "deb", "a .deb of a package the images need (repeat; see `packages`)")
	fs.Var(&tools, "tool", "NAME=DIR: the tests/tools/build.sh cache entry of a tool whose programs the images carry (repeat; see `tools`)")
	fs.Var(&only, "image", "build only this image (repeat; default: all)")
	version := fs.String("version", "", "version: the crate and chart appVersion")
	revision := fs.String("revision", "", "source revision (commit, -dirty when the tree had changes)")
	epoch := fs.Int64("epoch", -1, "SOURCE_DATE_EPOCH: file times and creation time (seconds)")
	source := fs.String("source", "https://github.com/topodra/topodra", "source repository URL (label)")
	licenses := fs.String("licenses", "Apache-2.0", "SPDX license expression of topodra (label)")
	registry := fs.String("registry", "ghcr.io/topodra", "repository prefix of the image references")
	arch := fs.String("arch", "amd64", "architecture: amd64 or arm64")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *out == "", *binDir == "":
		return errors.New("-out and -bin are required")
	case *version == "", *revision == "":
		return errors.New("-version and -revision are required")
	case *epoch < 0:
		return errors.New("-epoch (SOURCE_DATE_EPOCH) is required")
	}
	pf, ok := platforms[*arch]
	if !ok {
		return fmt.Errorf("unknown architecture %q", *arch)
	}
	defs := images
	if len(only) > 0 {
		defs = nil
		for _, n := range only {
			d, ok := findImage(n)
			if !ok {
				return fmt.Errorf("unknown image %q", n)
			}
			defs = append(defs, d)
		}
	}
	in := &buildInput{
		version:  *version,
		revision: *revision,
		epoch:    time.Unix(*epoch, 0).UTC(),
		source:   *source,
		licenses: *licenses,
		registry: *registry,
		platform: pf,
		debs:     map[string]*debPackage{},
		binaries: map[string][]byte{},
	}
	toolDirs := map[string]string{}
	for _, t := range tools {
		name, dir, ok := strings.Cut(t, "=")
		if !ok || name == "" || dir == "" {
			return fmt.Errorf("-tool %q: want NAME=DIR", t)
		}
		toolDirs[name] = dir
	}
	var err error
	if in.bundled, err = loadBundled(defs, toolDirs); err != nil {
		return err
	}
	for _, f := range debFiles {
		p, err := loadDeb(f)
		if err != nil {
			return err
		}
		if old, ok := in.debs[p.Name]; ok {
			return fmt.Errorf("two .debs of %s: %s and %s", p.Name, old.File, p.File)
		}
		in.debs[p.Name] = p
	}
	for _, d := range defs {
		for _, b := range d.binaries {
			data, err := os.ReadFile(filepath.Join(*binDir, b))
			if err != nil {
				return err
			}
			in.binaries[b] = data
		}
	}
	built, err := assemble(in, defs)
	if err != nil {
		return err
	}
	rec, err := writeOutputs(*out, in, built)
	if err != nil {
		return err
	}
	for _, im := range rec.Images {
		fmt.Printf("%-24s %s  %s  (%.1f MiB compressed, %.1f MiB unpacked)\n", im.Name, im.Reference, im.Digest,
			float64(im.CompressedSize)/(1<<20), float64(im.UncompressedSize)/(1<<20))
	}
	return nil
}
