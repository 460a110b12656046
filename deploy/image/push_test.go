package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"sigs.k8s.io/yaml"
)

// chartPackage is a chart package as `helm package` lays it out: <name>/Chart.yaml
// and the rest under one directory.
func chartPackage(t *testing.T, chartYAML string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, f := range []struct{ name, data string }{
		{"topodra/Chart.yaml", chartYAML},
		{"topodra/values.yaml", "image: {}\n"},
		{"topodra/charts/sub/Chart.yaml", "name: sub\nversion: 9.9.9\n"},
	} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestPush pushes the fixture build's layout and a chart package to
// go-containerregistry's in-process registry: each image lands under the registry path
// by its tag with the layout's digest, and the chart as Helm's OCI artifact (config
// media type, one layer holding the package's bytes, the version tag with "_" for "+").
func TestPush(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	reg := strings.TrimPrefix(srv.URL, "http://") + "/team/gpu"

	out := t.TempDir()
	rec := buildInto(t, fixtureInput(t), out)
	pkg := chartPackage(t, "apiVersion: v2\nname: topodra\nversion: 0.4.0+build.1\nappVersion: \"0.1.0\"\ndescription: GPUs\n")
	chartFile := filepath.Join(t.TempDir(), "topodra-0.4.0.tgz")
	if err := os.WriteFile(chartFile, pkg, 0o644); err != nil {
		t.Fatal(err)
	}
	recordFile := filepath.Join(t.TempDir(), "pushed.json")
	valuesFile := filepath.Join(t.TempDir(), "values.yaml")
	if err := cmdPush([]string{"-layout", filepath.Join(out, "oci"), "-registry", reg, "-chart", chartFile, "-record", recordFile, "-values", valuesFile}); err != nil {
		t.Fatal(err)
	}
	// The values file points the chart at the registry, each image by its digest.
	var values struct {
		Global struct {
			ImageRegistry string `json:"imageRegistry"`
		} `json:"global"`
		Image struct {
			Digest string `json:"digest"`
		} `json:"image"`
		Controller struct {
			Image struct {
				Digest string `json:"digest"`
			} `json:"image"`
		} `json:"controller"`
	}
	if err := yaml.UnmarshalStrict(mustRead(t, valuesFile), &values); err != nil {
		t.Fatal(err)
	}
	if values.Global.ImageRegistry != reg || values.Image.Digest != digestOf(t, rec, "topodra-kubelet-plugin") ||
		values.Controller.Image.Digest != digestOf(t, rec, "topodra-controller") {
		t.Errorf("values file:\n%s", mustRead(t, valuesFile))
	}
	raw, err := os.ReadFile(recordFile)
	if err != nil {
		t.Fatal(err)
	}
	var got []pushed
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(rec.Images)+1 {
		t.Fatalf("pushed %d artifacts, want %d images and the chart: %s", len(got), len(rec.Images), raw)
	}
	for _, im := range rec.Images {
		var p *pushed
		for i := range got {
			if got[i].Kind == "image" && got[i].Name == im.Name {
				p = &got[i]
			}
		}
		if p == nil {
			t.Fatalf("image %s not pushed: %s", im.Name, raw)
		}
		if p.Digest != im.Digest || p.Repository != reg+"/"+im.Name || p.Tag != "0.1.0" {
			t.Errorf("pushed %+v; want %s/%s:0.1.0@%s", *p, reg, im.Name, im.Digest)
		}
		// Pulled back by digest, the image is the layout's.
		img, err := pullImage(p.reference(), false)
		if err != nil {
			t.Fatal(err)
		}
		if d, err := img.Digest(); err != nil || d.String() != im.Digest {
			t.Errorf("pulled %s: digest %v, %v", p.reference(), d, err)
		}
	}

	c := got[len(got)-1]
	if c.Kind != "chart" || c.Repository != reg+"/topodra" || c.Tag != "0.4.0_build.1" {
		t.Fatalf("chart pushed as %+v", c)
	}
	ref, err := name.ParseReference(c.Repository + "@" + c.Digest)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := remote.Get(ref)
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		MediaType string `json:"mediaType"`
		Config    struct {
			MediaType string `json:"mediaType"`
		} `json:"config"`
		Layers []struct {
			MediaType string `json:"mediaType"`
			Size      int64  `json:"size"`
		} `json:"layers"`
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(desc.Manifest, &m); err != nil {
		t.Fatal(err)
	}
	if m.MediaType != "application/vnd.oci.image.manifest.v1+json" || m.Config.MediaType != string(helmConfigMediaType) ||
		len(m.Layers) != 1 || m.Layers[0].MediaType != string(helmChartMediaType) || m.Layers[0].Size != int64(len(pkg)) {
		t.Errorf("chart manifest: %s", desc.Manifest)
	}
	if m.Annotations["org.opencontainers.image.title"] != "topodra" || m.Annotations["org.opencontainers.image.version"] != "0.4.0+build.1" {
		t.Errorf("chart annotations: %v", m.Annotations)
	}

	// Pushing the same inputs again gives the same digests: nothing in them is the time.
	again := filepath.Join(t.TempDir(), "again.json")
	if err := cmdPush([]string{"-layout", filepath.Join(out, "oci"), "-registry", reg, "-chart", chartFile, "-record", again}); err != nil {
		t.Fatal(err)
	}
	if raw2, _ := os.ReadFile(again); !bytes.Equal(raw, raw2) {
		t.Errorf("a second push differs:\n%s\n%s", raw, raw2)
	}
}

// TestPushRefuses: bad registries and chart packages fail with the reason, before
// anything is pushed.
func TestPushRefuses(t *testing.T) {
	out := t.TempDir()
	buildInto(t, fixtureInput(t), out)
	layoutDir := filepath.Join(out, "oci")
	notChart := filepath.Join(t.TempDir(), "x.tgz")
	if err := os.WriteFile(notChart, []byte("not gzip"), 0o644); err != nil {
		t.Fatal(err)
	}
	noName := filepath.Join(t.TempDir(), "y.tgz")
	if err := os.WriteFile(noName, chartPackage(t, "apiVersion: v2\nversion: 1.0.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-layout", layoutDir}, "-registry is required"},
		{[]string{"-layout", layoutDir, "-registry", "https://r.example.com/x"}, "without a scheme"},
		{[]string{"-layout", layoutDir, "-registry", "r.example.com/x/"}, "trailing slash"},
		{[]string{"-layout", t.TempDir(), "-registry", "127.0.0.1:1/x"}, "make image"},
		// Refused before the images go out: nothing listens on port 1, so an attempt
		// to push would fail with "connection refused" instead.
		{[]string{"-layout", layoutDir, "-registry", "127.0.0.1:1/x", "-chart", notChart}, "not a chart package"},
		{[]string{"-layout", layoutDir, "-registry", "127.0.0.1:1/x", "-chart", noName}, "no name or version"},
	} {
		err := cmdPush(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("push %v: %v; want an error with %q", tc.args, err, tc.want)
		}
	}
}

func digestOf(t *testing.T, rec *buildRecord, image string) string {
	t.Helper()
	for _, im := range rec.Images {
		if im.Name == image {
			return im.Digest
		}
	}
	t.Fatalf("no image %s in the build", image)
	return ""
}

func mustRead(t *testing.T, f string) []byte {
	t.Helper()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
