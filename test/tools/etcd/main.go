// Command etcd runs etcd's own entry point; it exists so that etcd can be
// built from Go modules alone.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
