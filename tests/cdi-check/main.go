// Command cdi-check loads a CDI spec directory with the container-device-interface
// library, the registry/cache code containerd and CRI-O use to resolve the CDI device
// ids the kubelet hands them, and shows what a runtime would do with it: the edits
// injecting the given devices makes to an OCI runtime spec.
//
// Usage:
//
//	cdi-check --spec-dir DIR [--spec-dir DIR2 ...] [--oci-spec in.json] [--oci-spec-out out.json] DEVICE_ID...
//	cdi-check --spec-dir DIR --validate-only [DEVICE_ID...]
//
// Any error the cache records for any spec in the directories is fatal (a runtime
// would skip that spec and log it; for our specs that is always a bug). On success
// the result is printed as JSON on stdout; on failure the library's error text goes
// to stderr and the exit status is 1 (2 for usage errors).
//
// The JSON of an injection:
//
//	{
//	  "library": "tags.cncf.io/container-device-interface v1.1.2",
//	  "specDirs": ["/var/run/cdi"],
//	  "specs": [{"path": "...", "kind": "vendor/class", "cdiVersion": "0.5.0", "devices": ["vendor/class=name", ...]}],
//	  "requested": ["vendor/class=name", ...],
//	  "linux": {
//	    "devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}],
//	    "resources": {"devices": [{"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rw"}]}
//	  },
//	  "mounts": [{"source": "...", "destination": "...", "type": "bind", "options": ["ro", ...]}],
//	  "process": {"env": ["KEY=value", ...]},
//	  "hooks": {"createContainer": [{"path": "...", "args": [...]}]}
//	}
//
// With --validate-only nothing is injected; "specs" lists what loaded and each given
// device id must resolve.
//
// With --oci-spec-out the whole edited runtime spec is also written to that file, as
// the runtime would hand it to runc or crun: a test can run a real container with it.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sort"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
)

const cdiModule = "tags.cncf.io/container-device-interface"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// Exit statuses.
const (
	exitOK    = 0
	exitFail  = 1
	exitUsage = 2
)

type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

// Result is the JSON printed on success.
type Result struct {
	Library   string       `json:"library"`
	SpecDirs  []string     `json:"specDirs"`
	Specs     []SpecInfo   `json:"specs"`
	Requested []string     `json:"requested"`
	Linux     *LinuxResult `json:"linux,omitempty"`
	Mounts    []oci.Mount  `json:"mounts,omitempty"`
	Process   *Process     `json:"process,omitempty"`
	Hooks     *oci.Hooks   `json:"hooks,omitempty"`
}

// SpecInfo describes one spec file the cache loaded.
type SpecInfo struct {
	Path       string   `json:"path"`
	Kind       string   `json:"kind"`
	CDIVersion string   `json:"cdiVersion"`
	Devices    []string `json:"devices"`
}

// LinuxResult is the part of the OCI spec's `linux` section CDI edits.
type LinuxResult struct {
	Devices   []oci.LinuxDevice `json:"devices"`
	Resources *Resources        `json:"resources,omitempty"`
}

// Resources holds the device cgroup rules the injection added.
type Resources struct {
	Devices []oci.LinuxDeviceCgroup `json:"devices"`
}

// Process is the part of the OCI spec's `process` section CDI edits.
type Process struct {
	Env            []string `json:"env"`
	AdditionalGids []uint32 `json:"additionalGids,omitempty"`
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cdi-check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var specDirs stringList
	fs.Var(&specDirs, "spec-dir", "CDI spec `directory` (repeatable; later ones take precedence, as in a runtime's cdi_spec_dirs)")
	ociSpecPath := fs.String("oci-spec", "", "OCI runtime spec (config.json) `file` to inject into (default: a minimal spec)")
	validateOnly := fs.Bool("validate-only", false, "load and validate the specs, check that the given device ids resolve, inject nothing")
	ociSpecOut := fs.String("oci-spec-out", "", "also write the whole edited OCI runtime spec to `file`")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: cdi-check --spec-dir DIR [--oci-spec in.json] [--oci-spec-out out.json] [--validate-only] DEVICE_ID...\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	devices := fs.Args()
	if len(specDirs) == 0 {
		fmt.Fprintln(stderr, "cdi-check: --spec-dir is required")
		fs.Usage()
		return exitUsage
	}
	if len(devices) == 0 && !*validateOnly {
		fmt.Fprintln(stderr, "cdi-check: no device ids given (use --validate-only to only load the specs)")
		fs.Usage()
		return exitUsage
	}
	if *validateOnly && *ociSpecOut != "" {
		fmt.Fprintln(stderr, "cdi-check: --oci-spec-out needs an injection, not --validate-only")
		fs.Usage()
		return exitUsage
	}
	for _, d := range devices {
		if _, _, _, err := parser.ParseQualifiedName(d); err != nil {
			fmt.Fprintf(stderr, "cdi-check: %q is not a fully qualified CDI device id: %v\n", d, err)
			return exitUsage
		}
	}
	// The library skips a missing directory silently (a runtime may be configured
	// with one that appears later); here it is a mistake in the caller.
	for _, dir := range specDirs {
		st, err := os.Stat(dir)
		if err != nil {
			fmt.Fprintf(stderr, "cdi-check: spec dir: %v\n", err)
			return exitFail
		}
		if !st.IsDir() {
			fmt.Fprintf(stderr, "cdi-check: spec dir %s is not a directory\n", dir)
			return exitFail
		}
	}

	res, spec, err := check(specDirs, *ociSpecPath, *validateOnly, devices)
	if err != nil {
		fmt.Fprintf(stderr, "cdi-check: %v\n", err)
		return exitFail
	}
	if *ociSpecOut != "" {
		if err := writeOCISpec(*ociSpecOut, spec); err != nil {
			fmt.Fprintf(stderr, "cdi-check: %v\n", err)
			return exitFail
		}
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(res); err != nil {
		fmt.Fprintf(stderr, "cdi-check: %v\n", err)
		return exitFail
	}
	return exitOK
}

// check builds the cache as a runtime does, fails on any spec error, and injects. The
// edited spec is nil with validateOnly.
func check(specDirs []string, ociSpecPath string, validateOnly bool, devices []string) (*Result, *oci.Spec, error) {
	// A runtime configures the cache once with its spec dirs and keeps it refreshed
	// with a watch; a one-shot check refreshes by hand instead.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(specDirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, nil, err
	}
	if err := cache.Refresh(); err != nil {
		return nil, nil, specErrors(cache)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		return nil, nil, specErrors(cache)
	}

	res := &Result{
		Library:   libraryVersion(),
		SpecDirs:  cache.GetSpecDirectories(),
		Specs:     loadedSpecs(cache),
		Requested: append([]string{}, devices...),
	}

	if validateOnly {
		var unresolved []string
		for _, d := range devices {
			if cache.GetDevice(d) == nil {
				unresolved = append(unresolved, d)
			}
		}
		if len(unresolved) > 0 {
			return nil, nil, fmt.Errorf("unresolvable CDI devices %s", strings.Join(unresolved, ", "))
		}
		return res, nil, nil
	}

	spec, err := loadOCISpec(ociSpecPath)
	if err != nil {
		return nil, nil, err
	}
	if _, err := cache.InjectDevices(spec, devices...); err != nil {
		// The error names the unresolvable devices, or says why applying failed.
		return nil, nil, err
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		return nil, nil, specErrors(cache)
	}

	if spec.Linux != nil {
		res.Linux = &LinuxResult{Devices: nonNil(spec.Linux.Devices)}
		if spec.Linux.Resources != nil && len(spec.Linux.Resources.Devices) > 0 {
			res.Linux.Resources = &Resources{Devices: spec.Linux.Resources.Devices}
		}
	}
	res.Mounts = spec.Mounts
	if spec.Process != nil {
		res.Process = &Process{Env: nonNil(spec.Process.Env), AdditionalGids: spec.Process.User.AdditionalGids}
	}
	res.Hooks = spec.Hooks
	return res, spec, nil
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// specErrors joins every error the cache recorded, one line per error, prefixed with
// the file it belongs to, in a stable order.
func specErrors(cache *cdi.Cache) error {
	byPath := cache.GetErrors()
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var lines []string
	for _, p := range paths {
		for _, e := range byPath[p] {
			lines = append(lines, fmt.Sprintf("%s: %v", p, e))
		}
	}
	if len(lines) == 0 {
		return errors.New("CDI cache refresh failed without naming a spec")
	}
	return fmt.Errorf("%d CDI spec error(s):\n%s", len(lines), strings.Join(lines, "\n"))
}

func loadedSpecs(cache *cdi.Cache) []SpecInfo {
	out := []SpecInfo{}
	for _, vendor := range cache.ListVendors() {
		for _, s := range cache.GetVendorSpecs(vendor) {
			info := SpecInfo{Path: s.GetPath(), Kind: s.Kind, CDIVersion: s.Version, Devices: []string{}}
			for _, d := range s.Devices {
				info.Devices = append(info.Devices, parser.QualifiedName(s.GetVendor(), s.GetClass(), d.Name))
			}
			sort.Strings(info.Devices)
			out = append(out, info)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

// loadOCISpec reads a runtime spec, or returns the smallest one a runtime would pass:
// a process with no env and an empty linux section, so the result shows exactly the
// CDI edits.
func loadOCISpec(path string) (*oci.Spec, error) {
	if path == "" {
		return &oci.Spec{
			Version: oci.Version,
			Process: &oci.Process{Args: []string{"/bin/true"}, Cwd: "/"},
			Root:    &oci.Root{Path: "rootfs"},
			Linux:   &oci.Linux{},
		}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("OCI spec: %w", err)
	}
	var spec oci.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return nil, fmt.Errorf("OCI spec %s: %w", path, err)
	}
	return &spec, nil
}

// writeOCISpec replaces path only once the spec is whole, so a runtime started on it
// never reads half a config.json.
func writeOCISpec(path string, spec *oci.Spec) error {
	data, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("OCI spec out: %w", err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("OCI spec out: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("OCI spec out: %w", err)
	}
	return nil
}

func libraryVersion() string {
	info, ok := debug.ReadBuildInfo()
	if ok {
		for _, dep := range info.Deps {
			if dep.Path == cdiModule {
				if dep.Replace != nil {
					dep = dep.Replace
				}
				return cdiModule + " " + dep.Version
			}
		}
	}
	return cdiModule + " (unknown version)"
}
