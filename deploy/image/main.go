// Command topodra-image assembles topodra's container images without a container
// daemon: layers from Debian packages and the release binaries, written as an OCI
// image layout and as `docker load` tarballs, byte for byte the same for the same
// inputs. deploy/image/build.sh (`make image`) gathers the inputs and runs it; the
// images and their contents are described in images.go and docs/deployment.md.
//
//	topodra-image packages [-image NAME]
//	    the Debian packages the images are assembled from, one per line
//	topodra-image tools
//	    the tests/tools/build.sh tools whose programs the images carry, one per line
//	topodra-image build -out DIR -bin DIR -deb FILE... -tool NAME=DIR... -version V -revision R -epoch N
//	    write DIR/oci, DIR/<image>-<version>.docker.tar, DIR/topodra-images-<version>.oci.tar
//	    and DIR/build.json; print each image's reference and digest
//	topodra-image unpack [-layout DIR] -ref NAME -dest DIR
//	topodra-image unpack -pull REGISTRY/NAME:TAG@DIGEST [-insecure] -dest DIR
//	    apply an image's layers in order into DIR (a root filesystem to chroot into)
//	topodra-image push [-layout DIR] -registry HOST/PATH [-chart FILE.tgz] [-insecure] [-record FILE]
//	    push the layout's images (by tag; the digests are the layout's) and a packaged
//	    chart as Helm's OCI artifact; print each reference with its digest
//	topodra-image sbom -build DIR/build.json -cargo-metadata FILE -out FILE
//	    an SPDX 2.3 JSON document: the images, their Debian packages, their crates
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "packages":
		err = cmdPackages(os.Args[2:])
	case "tools":
		err = cmdTools(os.Args[2:])
	case "build":
		err = cmdBuild(os.Args[2:])
	case "unpack":
		err = cmdUnpack(os.Args[2:])
	case "sbom":
		err = cmdSBOM(os.Args[2:])
	case "push":
		err = cmdPush(os.Args[2:])
	case "-h", "-help", "--help", "help":
		usage()
		return
	default:
		fmt.Fprintf(os.Stderr, "topodra-image: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "topodra-image %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: topodra-image COMMAND [flags]

commands:
  packages   the Debian packages the images need (-image NAME for one image)
  tools      the tests/tools/build.sh tools whose programs the images carry
  build      assemble the images (see deploy/image/build.sh)
  unpack     write an image's root filesystem into a directory (from the layout or a registry)
  push       push the images and the chart package to a registry
  sbom       write the SPDX SBOM of a build

Run "topodra-image COMMAND -h" for the flags of a command.
`)
}

// multiFlag collects a repeated string flag.
type multiFlag []string

func (m *multiFlag) String() string { return fmt.Sprint(*m) }

func (m *multiFlag) Set(v string) error {
	*m = append(*m, v)
	return nil
}
