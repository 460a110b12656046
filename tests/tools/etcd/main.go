// Command etcd is the upstream etcd server (go.etcd.io/etcd/server/v3, pinned in
// go.mod), built the way etcd's own main package does it: everything is in etcdmain.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
