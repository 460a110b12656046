package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
)

// cargoMetadata is the part of `cargo metadata --format-version 1` the SBOM reads.
type cargoMetadata struct {
	Packages []struct {
		ID          string `json:"id"`
		Name        string `json:"name"`
		Version     string `json:"version"`
		License     string `json:"license"`
		LicenseFile string `json:"license_file"`
		Source      string `json:"source"`
		Targets     []struct {
			Kind []string `json:"kind"`
		} `json:"targets"`
	} `json:"packages"`
	WorkspaceMembers []string `json:"workspace_members"`
	Resolve          struct {
		Nodes []struct {
			ID   string `json:"id"`
			Deps []struct {
				Pkg      string `json:"pkg"`
				DepKinds []struct {
					Kind *string `json:"kind"`
				} `json:"dep_kinds"`
			} `json:"deps"`
		} `json:"nodes"`
	} `json:"resolve"`
}

// imageCrates maps each image to the workspace package whose binaries it holds.
var imageCrates = map[string]string{
	"topodra-kubelet-plugin": "topodra-kubelet-plugin",
	"topodra-controller":     "topodra-controller",
}

type spdxDoc struct {
	SPDXVersion       string             `json:"spdxVersion"`
	DataLicense       string             `json:"dataLicense"`
	SPDXID            string             `json:"SPDXID"`
	Name              string             `json:"name"`
	DocumentNamespace string             `json:"documentNamespace"`
	CreationInfo      spdxCreation       `json:"creationInfo"`
	Packages          []spdxPackage      `json:"packages"`
	Relationships     []spdxRelationship `json:"relationships"`
}

type spdxCreation struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type spdxPackage struct {
	SPDXID           string            `json:"SPDXID"`
	Name             string            `json:"name"`
	VersionInfo      string            `json:"versionInfo"`
	DownloadLocation string            `json:"downloadLocation"`
	FilesAnalyzed    bool              `json:"filesAnalyzed"`
	LicenseConcluded string            `json:"licenseConcluded"`
	LicenseDeclared  string            `json:"licenseDeclared"`
	CopyrightText    string            `json:"copyrightText"`
	Supplier         string            `json:"supplier,omitempty"`
	PrimaryPurpose   string            `json:"primaryPackagePurpose,omitempty"`
	Checksums        []spdxChecksum    `json:"checksums,omitempty"`
	ExternalRefs     []spdxExternalRef `json:"externalRefs,omitempty"`
	Comment          string            `json:"comment,omitempty"`
}

type spdxChecksum struct {
	Algorithm string `json:"algorithm"`
	Value     string `json:"checksumValue"`
}

type spdxExternalRef struct {
	Category string `json:"referenceCategory"`
	Type     string `json:"referenceType"`
	Locator  string `json:"referenceLocator"`
}

type spdxRelationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

var spdxIDUnsafe = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

func spdxID(kind, name, version string) string {
	id := "SPDXRef-" + kind + "-" + name
	if version != "" {
		id += "-" + version
	}
	return spdxIDUnsafe.ReplaceAllString(id, "-")
}

// spdxLicense turns a Cargo license field into an SPDX expression: the old "MIT/Apache-2.0"
// form means "MIT OR Apache-2.0".
func spdxLicense(cargo string) string {
	if cargo == "" {
		return "NOASSERTION"
	}
	parts := strings.Split(cargo, "/")
	for i, p := range parts {
		parts[i] = strings.TrimSpace(p)
	}
	return strings.Join(parts, " OR ")
}

// runtimeCrates is the set of packages compiled into root's binaries: normal
// dependencies, transitively, without build scripts' dependencies and without
// procedural macros, which run in the compiler and leave nothing in the binary.
func runtimeCrates(md *cargoMetadata, root string) ([]string, error) {
	procMacro := map[string]bool{}
	for _, p := range md.Packages {
		for _, t := range p.Targets {
			if slices.Contains(t.Kind, "proc-macro") {
				procMacro[p.ID] = true
			}
		}
	}
	deps := map[string][]string{}
	for _, n := range md.Resolve.Nodes {
		for _, d := range n.Deps {
			normal := false
			for _, k := range d.DepKinds {
				if k.Kind == nil {
					normal = true
				}
			}
			if normal && !procMacro[d.Pkg] {
				deps[n.ID] = append(deps[n.ID], d.Pkg)
			}
		}
	}
	var rootID string
	for _, p := range md.Packages {
		if p.Name == root && slices.Contains(md.WorkspaceMembers, p.ID) {
			rootID = p.ID
		}
	}
	if rootID == "" {
		return nil, fmt.Errorf("no workspace package %s in the cargo metadata", root)
	}
	seen := map[string]bool{rootID: true}
	queue := []string{rootID}
	for len(queue) > 0 {
		id := queue[0]
		queue = queue[1:]
		for _, d := range deps[id] {
			if !seen[d] {
				seen[d] = true
				queue = append(queue, d)
			}
		}
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// makeSBOM is the SPDX document of a build: one package per image, its Debian
// packages and its crates, each image CONTAINS what went into it.
func makeSBOM(rec *buildRecord, md *cargoMetadata) (*spdxDoc, error) {
	doc := &spdxDoc{
		SPDXVersion:       "SPDX-2.3",
		DataLicense:       "CC0-1.0",
		SPDXID:            "SPDXRef-DOCUMENT",
		Name:              "topodra-" + rec.Version,
		DocumentNamespace: strings.TrimSuffix(rec.Source, "/") + "/spdx/topodra-" + rec.Version + "-" + rec.Revision,
		CreationInfo: spdxCreation{
			Created:  rec.Created,
			Creators: []string{"Organization: topodra", "Tool: topodra-image (deploy/image)"},
		},
	}
	byID := map[string]int{}
	addPkg := func(p spdxPackage) {
		if _, ok := byID[p.SPDXID]; ok {
			return
		}
		byID[p.SPDXID] = len(doc.Packages)
		doc.Packages = append(doc.Packages, p)
	}
	pkgByID := map[string]int{}
	for i, p := range md.Packages {
		pkgByID[p.ID] = i
	}
	distro := rec.Distro
	for _, im := range rec.Images {
		repo := im.Reference
		if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
			repo = repo[:i]
		}
		imageID := spdxID("Image", im.Name, "")
		addPkg(spdxPackage{
			SPDXID:           imageID,
			Name:             im.Name,
			VersionInfo:      rec.Version,
			DownloadLocation: "NOASSERTION",
			LicenseConcluded: "NOASSERTION",
			LicenseDeclared:  "NOASSERTION",
			CopyrightText:    "NOASSERTION",
			PrimaryPurpose:   "CONTAINER",
			Checksums:        []spdxChecksum{{"SHA256", strings.TrimPrefix(im.Digest, "sha256:")}},
			ExternalRefs: []spdxExternalRef{{"PACKAGE-MANAGER", "purl",
				"pkg:oci/" + im.Name + "@" + url.QueryEscape(im.Digest) + "?repository_url=" + url.QueryEscape(repo) + "&tag=" + url.QueryEscape(rec.Version)}},
			Comment: "revision " + rec.Revision + ", " + rec.Platform,
		})
		doc.Relationships = append(doc.Relationships, spdxRelationship{"SPDXRef-DOCUMENT", "DESCRIBES", imageID})
		for _, p := range im.Packages {
			id := spdxID("Deb", p.Name, p.Version)
			purl := "pkg:deb/debian/" + p.Name + "@" + url.PathEscape(p.Version) + "?arch=" + p.Architecture
			if distro != "" {
				purl += "&distro=" + distro
			}
			addPkg(spdxPackage{
				SPDXID:           id,
				Name:             p.Name,
				VersionInfo:      p.Version,
				DownloadLocation: "NOASSERTION",
				LicenseConcluded: "NOASSERTION",
				LicenseDeclared:  "NOASSERTION",
				CopyrightText:    "NOASSERTION",
				Supplier:         "Organization: Debian",
				PrimaryPurpose:   "LIBRARY",
				Checksums:        []spdxChecksum{{"SHA256", p.SHA256}},
				ExternalRefs:     []spdxExternalRef{{"PACKAGE-MANAGER", "purl", purl}},
				Comment:          "from " + p.File + "; its copyright file is /usr/share/doc/" + p.Name + "/copyright in the image",
			})
			doc.Relationships = append(doc.Relationships, spdxRelationship{imageID, "CONTAINS", id})
		}
		for _, b := range im.Bundled {
			for _, id := range addBundled(addPkg, b) {
				doc.Relationships = append(doc.Relationships, spdxRelationship{imageID, "CONTAINS", id})
			}
		}
		root, ok := imageCrates[im.Name]
		if !ok {
			return nil, fmt.Errorf("no crate known for image %s", im.Name)
		}
		ids, err := runtimeCrates(md, root)
		if err != nil {
			return nil, err
		}
		for _, cid := range ids {
			c := md.Packages[pkgByID[cid]]
			id := spdxID("Crate", c.Name, c.Version)
			p := spdxPackage{
				SPDXID:           id,
				Name:             c.Name,
				VersionInfo:      c.Version,
				DownloadLocation: "NOASSERTION",
				LicenseConcluded: "NOASSERTION",
				LicenseDeclared:  spdxLicense(c.License),
				CopyrightText:    "NOASSERTION",
				PrimaryPurpose:   "LIBRARY",
				ExternalRefs:     []spdxExternalRef{{"PACKAGE-MANAGER", "purl", "pkg:cargo/" + c.Name + "@" + c.Version}},
			}
			switch {
			case strings.HasPrefix(c.Source, "registry+https://github.com/rust-lang/crates.io-index"):
				p.DownloadLocation = "https://crates.io/api/v1/crates/" + c.Name + "/" + c.Version + "/download"
			case c.Source == "":
				// A workspace crate: topodra itself.
				p.DownloadLocation = rec.Source
				p.PrimaryPurpose = "APPLICATION"
				p.Comment = "topodra workspace crate, revision " + rec.Revision
			}
			addPkg(p)
			doc.Relationships = append(doc.Relationships, spdxRelationship{imageID, "CONTAINS", id})
		}
	}
	return doc, nil
}

func cmdSBOM(args []string) error {
	fs := flag.NewFlagSet("sbom", flag.ContinueOnError)
	build := fs.String("build", "target/image/build.json", "build.json of the images")
	metadata := fs.String("cargo-metadata", "", "output of `cargo metadata --format-version 1 --filter-platform <target>`")
	out := fs.String("out", "", "SPDX JSON file to write")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *metadata == "" || *out == "" {
		return errors.New("-cargo-metadata and -out are required")
	}
	var rec buildRecord
	if err := readJSON(*build, &rec); err != nil {
		return err
	}
	var md cargoMetadata
	if err := readJSON(*metadata, &md); err != nil {
		return err
	}
	doc, err := makeSBOM(&rec, &md)
	if err != nil {
		return err
	}
	js, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(*out, append(js, '\n'), 0o644)
}

func readJSON(file string, v any) error {
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return nil
}

// addBundled adds the SPDX packages of a bundled binary: its Go module, with the
// licence the image ships for it, and every other module linked into it (their
// licences are in the project's THIRD_PARTY_NOTICES.md, not asserted here). Returns
// their ids.
func addBundled(addPkg func(spdxPackage), b bundledRecord) []string {
	def, _ := findBundled(b.Path)
	id := spdxID("Go", b.Module, b.Version)
	p := spdxPackage{
		SPDXID:           id,
		Name:             b.Module,
		VersionInfo:      b.Version,
		DownloadLocation: "NOASSERTION",
		LicenseConcluded: "NOASSERTION",
		LicenseDeclared:  b.License,
		CopyrightText:    "NOASSERTION",
		Supplier:         def.supplier,
		PrimaryPurpose:   "APPLICATION",
		ExternalRefs:     []spdxExternalRef{{"PACKAGE-MANAGER", "purl", "pkg:golang/" + b.Module + "@" + b.Version}},
		Comment: b.Path + " (sha256 " + b.SHA256 + "), built with " + b.GoVersion + " by tests/tools/build.sh " + b.Tool +
			"; licence files: " + strings.Join(b.Docs, ", "),
	}
	if def.homepage != "" {
		p.DownloadLocation = "git+" + def.homepage + "@" + b.Version
	}
	addPkg(p)
	ids := []string{id}
	for _, dep := range b.Deps {
		path, version, _ := strings.Cut(dep, "@")
		did := spdxID("Go", path, version)
		addPkg(spdxPackage{
			SPDXID:           did,
			Name:             path,
			VersionInfo:      version,
			DownloadLocation: "NOASSERTION",
			LicenseConcluded: "NOASSERTION",
			LicenseDeclared:  "NOASSERTION",
			CopyrightText:    "NOASSERTION",
			PrimaryPurpose:   "LIBRARY",
			ExternalRefs:     []spdxExternalRef{{"PACKAGE-MANAGER", "purl", "pkg:golang/" + path + "@" + version}},
			Comment:          "linked into " + b.Path,
		})
		ids = append(ids, did)
	}
	return ids
}
