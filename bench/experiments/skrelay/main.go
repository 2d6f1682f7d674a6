package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: skrelay bench [flags] | relay [flags] | server [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "bench":
		err = benchMain(os.Args[2:])
	case "relay":
		err = relayMain(os.Args[2:])
	case "server":
		err = serverMain(os.Args[2:])
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "skrelay:", err)
		os.Exit(1)
	}
}
