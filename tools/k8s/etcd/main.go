// Command etcd is the etcd server, exactly as upstream's: etcdmain.Main with the process
// arguments. It exists so scripts/build-k8s.sh can build a pinned etcd from the module proxy
// (Debian's etcd-server is 3.4).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
