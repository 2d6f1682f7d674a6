package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "deathstar":
		runDeathstar(os.Args[2:])
	case "ship":
		runShip(os.Args[2:])
	case "ftp-get":
		runFTPGet(os.Args[2:])
	case "wait-tcp":
		runWaitTCP(os.Args[2:])
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, `usage:
  starwars deathstar [--listen :80] [--storage NAME=ftp://user:pass@host/path ...]
  starwars ship [--name NAME] [--timeout 2s] METHOD URL
  starwars ftp-get [--timeout 5s] ftp://[user[:pass]@]host[:port]/path
  starwars wait-tcp [--timeout 10s] HOST:PORT`)
	os.Exit(2)
}
