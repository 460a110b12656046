package main

import (
	"flag"
	"fmt"
	"slices"
)

// pkgRule names a Debian package whose files go into an image. With only set, just
// those paths (after the /usr merge) are taken, plus the package's copyright file;
// otherwise every file except documentation, manuals, locales and iconv modules.
type pkgRule struct {
	name string
	only []string
}

// imageDef is one image. Every image has the base layer (glibc, libgcc, the
// os-release and user database), then a layer of its own libraries if it has any,
// then a layer of the other projects' programs it carries if it has any, then its
// binaries in /usr/bin.
type imageDef struct {
	name        string
	title       string
	description string
	// binaries are release binaries, installed as /usr/bin/<name>; the first is
	// the entrypoint.
	binaries []string
	// packages are the libraries the binaries need beyond the base layer.
	packages []pkgRule
	// bundled are other projects' programs the image carries (bundled.go).
	bundled []bundledBinary
	// user is the image config's User: root where the component needs it.
	user string
}

// nvidiaCDIHook is NVIDIA's nvidia-cdi-hook: every claim's CDI spec names it in its
// hooks, and the plugin installs this copy on the host at start (docs/operations.md).
// A cgo build (go-nvml), linked against glibc only, which the base layer has.
var nvidiaCDIHook = bundledBinary{
	name:     "nvidia-cdi-hook",
	tool:     "nvidia-ctk",
	module:   "github.com/NVIDIA/nvidia-container-toolkit",
	project:  "nvidia-container-toolkit",
	license:  "Apache-2.0",
	supplier: "Organization: NVIDIA Corporation",
	homepage: "https://github.com/NVIDIA/nvidia-container-toolkit",
	// The toolkit's licence, and the licences of the Go modules in its binaries.
	docs: []string{"LICENSE", "THIRD_PARTY_NOTICES.md"},
}

// The package names are Debian 12's (bookworm): the release binaries are linked on
// Debian 12 against its glibc and hwloc, and the image carries the same libraries.
// Another base release changes some names (libhwloc15, gcc-12-base) and is a change
// here.
var basePackages = []pkgRule{
	{name: "libc6"},
	{name: "libgcc-s1"},
	// Only for the copyright file that libgcc-s1's documentation links to.
	{name: "gcc-12-base", only: []string{}},
	// os-release tells image scanners the distribution, so that they match the
	// packages in /var/lib/dpkg/status.d against its security advisories.
	{name: "base-files", only: []string{"etc/os-release", "usr/lib/os-release", "etc/debian_version"}},
}

var images = []imageDef{
	{
		name:        "topodra-kubelet-plugin",
		title:       "topodra kubelet plugin",
		description: "topodra DRA kubelet plugin for NVIDIA GPUs: discovers GPUs and their NUMA, PCIe and NVLink topology and serves the kubelet's DRA calls",
		binaries:    []string{"topodra-kubelet-plugin"},
		// hwlocality links libhwloc dynamically (pkg-config), and libhwloc links
		// libudev. NVML is not here: it comes from the node's driver at run time.
		packages: []pkgRule{{name: "libhwloc15"}, {name: "libudev1"}},
		bundled:  []bundledBinary{nvidiaCDIHook},
		// Root: it opens the /dev/nvidia* devices and writes sockets, CDI specs and
		// its checkpoint in root-owned host directories (the chart runs it
		// privileged).
		user: "0:0",
	},
	{
		name:        "topodra-controller",
		title:       "topodra controller",
		description: "topodra cluster controller (GPU capacity by topology, NodeResourceTopology, why-pending Events) and the kubectl-topodra plugin",
		binaries:    []string{"topodra-controller", "kubectl-topodra"},
		// No libraries beyond the base: the linker drops libhwloc (--as-needed), as
		// the controller never reads a machine's topology.
		// It only talks to the API server: the "nonroot" user of /etc/passwd.
		user: "65532:65532",
	},
}

func findImage(name string) (imageDef, bool) {
	for _, im := range images {
		if im.name == name {
			return im, true
		}
	}
	return imageDef{}, false
}

// packageNames lists the packages of the named image, or of every image, in the
// order they are layered, without repeats.
func packageNames(image string) ([]string, error) {
	var defs []imageDef
	if image == "" {
		defs = images
	} else {
		im, ok := findImage(image)
		if !ok {
			return nil, fmt.Errorf("unknown image %q", image)
		}
		defs = []imageDef{im}
	}
	var names []string
	add := func(rules []pkgRule) {
		for _, r := range rules {
			if !slices.Contains(names, r.name) {
				names = append(names, r.name)
			}
		}
	}
	add(basePackages)
	for _, im := range defs {
		add(im.packages)
	}
	return names, nil
}

func cmdPackages(args []string) error {
	fs := flag.NewFlagSet("packages", flag.ContinueOnError)
	image := fs.String("image", "", "only this image's packages")
	if err := fs.Parse(args); err != nil {
		return err
	}
	names, err := packageNames(*image)
	if err != nil {
		return err
	}
	for _, n := range names {
		fmt.Println(n)
	}
	return nil
}

// bundledTools lists the tests/tools/build.sh tools whose builds the images carry
// (build.sh passes each one's cache entry with -tool), without repeats.
func bundledTools() []string {
	var tools []string
	for _, im := range images {
		for _, b := range im.bundled {
			if !slices.Contains(tools, b.tool) {
				tools = append(tools, b.tool)
			}
		}
	}
	return tools
}

// cmdTools prints the tests/tools/build.sh tools the images carry programs of.
func cmdTools(args []string) error {
	fs := flag.NewFlagSet("tools", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, t := range bundledTools() {
		fmt.Println(t)
	}
	return nil
}
