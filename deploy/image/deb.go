package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// debPackage is a Debian package as the images use it: its control fields, for the
// records and for /var/lib/dpkg/status.d, and its data archive.
type debPackage struct {
	Name    string
	Version string
	Arch    string
	// Control is the package's control file, as dpkg-deb prints it.
	Control []byte
	// File and SHA256 identify the .deb (the base name only: where the cache is
	// differs from machine to machine).
	File   string
	SHA256 string
	// Data is the uncompressed data archive (dpkg-deb --fsys-tarfile).
	Data []byte
}

// loadDeb reads a .deb with dpkg-deb: the images are built on Debian, where it is
// always there, and it knows every compression a package may use.
func loadDeb(file string) (*debPackage, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(raw)
	control, err := runDpkgDeb("-f", file)
	if err != nil {
		return nil, err
	}
	data, err := runDpkgDeb("--fsys-tarfile", file)
	if err != nil {
		return nil, err
	}
	fields := controlFields(control)
	p := &debPackage{
		Name:    fields["Package"],
		Version: fields["Version"],
		Arch:    fields["Architecture"],
		Control: control,
		File:    filepath.Base(file),
		SHA256:  hex.EncodeToString(sum[:]),
		Data:    data,
	}
	if p.Name == "" || p.Version == "" || p.Arch == "" {
		return nil, fmt.Errorf("%s: no Package, Version or Architecture in its control file", file)
	}
	return p, nil
}

func runDpkgDeb(args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("dpkg-deb", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("dpkg-deb %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// controlFields reads the single-line fields of a control file.
func controlFields(control []byte) map[string]string {
	fields := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(control))
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == ' ' || line[0] == '\t' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields
}
