package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"sigs.k8s.io/yaml"
)

// The media types Helm gives a chart in an OCI registry (helm.sh/docs/topics/registries,
// "Helm chart manifest"): `helm pull` and `helm install oci://...` look for a manifest
// whose config has the first and whose one layer has the second.
const (
	helmConfigMediaType types.MediaType = "application/vnd.cncf.helm.config.v1+json"
	helmChartMediaType  types.MediaType = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
	// maxChartBytes bounds what is read of a chart package: ours is tens of kB.
	maxChartBytes = 16 << 20
)

// pushed is one artifact written to the registry: what `make push` prints and writes
// to its record, and what the install values are made from.
type pushed struct {
	// Kind is "image" or "chart".
	Kind string `json:"kind"`
	// Name is the image's or chart's name (topodra-kubelet-plugin, topodra).
	Name string `json:"name"`
	// Repository is registry/name, Tag the tag pushed, Digest the manifest's digest.
	Repository string `json:"repository"`
	Tag        string `json:"tag"`
	Digest     string `json:"digest"`
}

func (p pushed) reference() string { return p.Repository + ":" + p.Tag + "@" + p.Digest }

func cmdPush(args []string) error {
	fs := flag.NewFlagSet("push", flag.ContinueOnError)
	dir := fs.String("layout", "target/image/oci", "OCI image layout directory (make image)")
	registry := fs.String("registry", "", "registry host and optional path to push to, e.g. registry.example.com/gpu")
	chart := fs.String("chart", "", "a packaged chart (helm package) to push as an OCI artifact beside the images")
	insecure := fs.Bool("insecure", false, "allow plain HTTP to the registry (a registry without TLS); localhost and 127.0.0.1 are always allowed")
	record := fs.String("record", "", "write what was pushed here as JSON")
	values := fs.String("values", "", "write a chart values file here that installs the pushed images by digest")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *registry == "" {
		return errors.New("-registry is required (host[:port][/path], no scheme)")
	}
	if strings.Contains(*registry, "://") || strings.HasSuffix(*registry, "/") {
		return fmt.Errorf("-registry %q: give host[:port][/path], without a scheme or a trailing slash", *registry)
	}
	var nameOpts []name.Option
	if *insecure {
		nameOpts = append(nameOpts, name.Insecure)
	}
	// Credentials as docker and crane find them: $DOCKER_CONFIG/config.json or
	// ~/.docker/config.json, with their credential helpers.
	remoteOpts := []remote.Option{remote.WithAuthFromKeychain(authn.DefaultKeychain)}

	// Everything is read and checked before the first byte goes out, so a bad chart
	// package does not leave the images pushed without it.
	images, err := layoutImages(*dir)
	if err != nil {
		return err
	}
	var ch *chartArtifact
	if *chart != "" {
		if ch, err = readChart(*chart); err != nil {
			return err
		}
	}
	var out []pushed
	for _, li := range images {
		p, err := pushImage(*registry, li, nameOpts, remoteOpts)
		if err != nil {
			return err
		}
		out = append(out, p)
	}
	if ch != nil {
		p, err := ch.push(*registry, nameOpts, remoteOpts)
		if err != nil {
			return err
		}
		out = append(out, p)
	}
	for _, p := range out {
		fmt.Printf("%s %s\n", p.Kind, p.reference())
	}
	if *values != "" {
		if err := os.WriteFile(*values, installValues(*registry, out), 0o644); err != nil {
			return err
		}
	}
	if *record != "" {
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*record, append(b, '\n'), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// chartImageKeys are where the chart takes each image's digest (values.yaml).
var chartImageKeys = map[string]string{
	"topodra-kubelet-plugin": "image",
	"topodra-controller":     "controller.image",
}

// installValues is a values file for the chart that points both images at the
// registry and pins them by the digests just pushed.
func installValues(registry string, out []pushed) []byte {
	digest := map[string]string{}
	for _, p := range out {
		if key, ok := chartImageKeys[p.Name]; ok && p.Kind == "image" {
			digest[key] = p.Digest
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "# The images that topodra-image push wrote to %s, by digest:\n", registry)
	fmt.Fprintf(&b, "# helm install ... --values <this file>.\n")
	fmt.Fprintf(&b, "global:\n  imageRegistry: %q\n", registry)
	if d := digest["image"]; d != "" {
		fmt.Fprintf(&b, "image:\n  digest: %q\n", d)
	}
	if d := digest["controller.image"]; d != "" {
		fmt.Fprintf(&b, "controller:\n  image:\n    digest: %q\n", d)
	}
	return []byte(b.String())
}

// layoutImage is an image of the layout with the name and tag of its ref name.
type layoutImage struct {
	name, tag string
	img       v1.Image
}

// layoutImages are the images of the layout that carry a ref name (name:tag), in
// name order.
func layoutImages(dir string) ([]layoutImage, error) {
	lp, m, err := layoutIndex(dir)
	if err != nil {
		return nil, err
	}
	var out []layoutImage
	for _, d := range m.Manifests {
		ref := d.Annotations[refNameKey]
		n, tag, ok := strings.Cut(ref, ":")
		if !ok || n == "" || tag == "" {
			return nil, fmt.Errorf("%s: image %s has ref name %q, want name:tag", dir, d.Digest, ref)
		}
		img, err := lp.Image(d.Digest)
		if err != nil {
			return nil, err
		}
		out = append(out, layoutImage{name: n, tag: tag, img: img})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no images", dir)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

func pushImage(registry string, li layoutImage, nameOpts []name.Option, remoteOpts []remote.Option) (pushed, error) {
	repo := registry + "/" + li.name
	tag, err := name.NewTag(repo+":"+li.tag, nameOpts...)
	if err != nil {
		return pushed{}, fmt.Errorf("%s: %w", repo, err)
	}
	digest, err := li.img.Digest()
	if err != nil {
		return pushed{}, err
	}
	// Write sends the manifest as the layout holds it, so the registry's digest is the
	// layout's: the one digests.txt and the SBOM name.
	if err := remote.Write(tag, li.img, remoteOpts...); err != nil {
		return pushed{}, fmt.Errorf("push %s: %w", tag, err)
	}
	return pushed{Kind: "image", Name: li.name, Repository: repo, Tag: li.tag, Digest: digest.String()}, nil
}

// chartMeta is the part of Chart.yaml that names the artifact.
type chartMeta struct {
	Name        string `json:"name"`
	Version     string `json:"version"`
	Description string `json:"description"`
}

// chartArtifact is a chart package as Helm lays one out in a registry: the config
// blob is Chart.yaml as JSON, the one layer the package, the manifest annotated with
// the OCI title, version and description.
type chartArtifact struct {
	meta          chartMeta
	config, chart v1.Layer
	manifest      rawManifest
}

// readChart reads and checks a chart package and makes its artifact.
func readChart(file string) (*chartArtifact, error) {
	pkg, err := readLimited(file, maxChartBytes)
	if err != nil {
		return nil, err
	}
	chartYAML, err := chartYAMLOf(pkg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	config, err := yaml.YAMLToJSON(chartYAML)
	if err != nil {
		return nil, fmt.Errorf("%s: Chart.yaml: %w", file, err)
	}
	var meta chartMeta
	if err := json.Unmarshal(config, &meta); err != nil {
		return nil, fmt.Errorf("%s: Chart.yaml: %w", file, err)
	}
	if meta.Name == "" || meta.Version == "" {
		return nil, fmt.Errorf("%s: Chart.yaml has no name or version", file)
	}
	a := &chartArtifact{
		meta:   meta,
		config: static.NewLayer(config, helmConfigMediaType),
		chart:  static.NewLayer(pkg, helmChartMediaType),
	}
	if a.manifest, err = chartManifest(a.config, a.chart, meta); err != nil {
		return nil, err
	}
	return a, nil
}

// push writes the artifact to registry/<chart name>, so that `helm install
// oci://<registry>/<chart name>` finds it, tagged with the chart version with "+"
// (which tags may not hold) as "_", as `helm push` tags.
func (a *chartArtifact) push(registry string, nameOpts []name.Option, remoteOpts []remote.Option) (pushed, error) {
	repoName := registry + "/" + a.meta.Name
	tagName := strings.ReplaceAll(a.meta.Version, "+", "_")
	tag, err := name.NewTag(repoName+":"+tagName, nameOpts...)
	if err != nil {
		return pushed{}, fmt.Errorf("%s: %w", repoName, err)
	}
	for _, l := range []v1.Layer{a.config, a.chart} {
		if err := remote.WriteLayer(tag.Context(), l, remoteOpts...); err != nil {
			return pushed{}, fmt.Errorf("push %s: %w", tag, err)
		}
	}
	if err := remote.Put(tag, a.manifest, remoteOpts...); err != nil {
		return pushed{}, fmt.Errorf("push %s: %w", tag, err)
	}
	digest, _, err := v1.SHA256(bytes.NewReader(a.manifest.raw))
	if err != nil {
		return pushed{}, err
	}
	return pushed{Kind: "chart", Name: a.meta.Name, Repository: repoName, Tag: tagName, Digest: digest.String()}, nil
}

// rawManifest is a manifest to Put as it is.
type rawManifest struct {
	raw       []byte
	mediaType types.MediaType
}

func (m rawManifest) RawManifest() ([]byte, error)        { return m.raw, nil }
func (m rawManifest) MediaType() (types.MediaType, error) { return m.mediaType, nil }

func chartManifest(config, chart v1.Layer, meta chartMeta) (rawManifest, error) {
	desc := func(l v1.Layer) (v1.Descriptor, error) {
		d, err := l.Digest()
		if err != nil {
			return v1.Descriptor{}, err
		}
		size, err := l.Size()
		if err != nil {
			return v1.Descriptor{}, err
		}
		mt, err := l.MediaType()
		if err != nil {
			return v1.Descriptor{}, err
		}
		return v1.Descriptor{MediaType: mt, Digest: d, Size: size}, nil
	}
	cd, err := desc(config)
	if err != nil {
		return rawManifest{}, err
	}
	ld, err := desc(chart)
	if err != nil {
		return rawManifest{}, err
	}
	annotations := map[string]string{
		"org.opencontainers.image.title":   meta.Name,
		"org.opencontainers.image.version": meta.Version,
	}
	if meta.Description != "" {
		annotations["org.opencontainers.image.description"] = meta.Description
	}
	// No creation time: the same package gives the same manifest digest.
	m := v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		Config:        cd,
		Layers:        []v1.Descriptor{ld},
		Annotations:   annotations,
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return rawManifest{}, err
	}
	return rawManifest{raw: raw, mediaType: types.OCIManifestSchema1}, nil
}

// chartYAMLOf finds <chart>/Chart.yaml in a chart package (a gzipped tar whose entries
// sit under one directory named for the chart, as `helm package` writes it).
func chartYAMLOf(pkg []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(pkg))
	if err != nil {
		return nil, fmt.Errorf("not a chart package (gzip): %w", err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, errors.New("no <chart>/Chart.yaml in the package")
		}
		if err != nil {
			return nil, fmt.Errorf("not a chart package (tar): %w", err)
		}
		clean := path.Clean(h.Name)
		if dir, base := path.Split(clean); base == "Chart.yaml" && dir != "" && !strings.Contains(strings.TrimSuffix(dir, "/"), "/") {
			return io.ReadAll(io.LimitReader(tr, 1<<20))
		}
	}
}

// readLimited reads a file, refusing one larger than limit.
func readLimited(file string, limit int64) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", file, limit)
	}
	return b, nil
}
