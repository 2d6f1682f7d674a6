package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rampartnet/rampart/internal/api"
)

// readTapPolicy reads a tap policy file ("-": standard input) as the request's file name
// and text.
func (a *app) readTapPolicy(file string) (api.TapPolicyRequest, error) {
	if file == "" {
		return api.TapPolicyRequest{}, fmt.Errorf("give the policy with -f FILE (or -f - for stdin)")
	}
	var data []byte
	var err error
	if file == "-" {
		data, err = io.ReadAll(a.io.In)
		file = "stdin"
	} else {
		data, err = os.ReadFile(file)
		file = filepath.Base(file)
	}
	if err != nil {
		return api.TapPolicyRequest{}, fmt.Errorf("reading tap policy: %w", err)
	}
	return api.TapPolicyRequest{File: file, Source: string(data)}, nil
}

func (a *app) tapPolicyCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "policy",
		Short: "Apply, show and delete the agent's tap policy: Datalog rules that derive tap contracts from the model (docs/taps.md)",
	}
	var file string
	apply := &cobra.Command{
		Use:   "apply -f FILE",
		Short: "Make FILE the agent's tap policy (replacing any): compiled against the agent's facts, all of its contracts or none",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := a.readTapPolicy(file)
			if err != nil {
				return err
			}
			res, err := a.client.ApplyTapPolicy(contextOf(cmd), req)
			if err != nil {
				return err
			}
			a.printChanges(res)
			return nil
		},
	}
	apply.Flags().StringVarP(&file, "filename", "f", "", "the policy file (Datalog), or - for stdin")
	var output string
	get := &cobra.Command{
		Use:   "get",
		Short: "Show the tap policy, the contracts it yields now and any recompilation error",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := a.client.GetTapPolicy(contextOf(cmd))
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(p)
			}
			a.printf("tap policy %s (placement %s)\n", p.File, p.Strategy)
			if p.Error != "" {
				a.printf("error: the last recompilation failed (%s); its last good contracts stay installed: %s\n", p.ErrorAt.Format("2006-01-02T15:04:05Z07:00"), p.Error)
			}
			a.printCompiled(p, false)
			a.printf("---\n%s", p.Source)
			if !strings.HasSuffix(p.Source, "\n") {
				a.printf("\n")
			}
			return nil
		},
	}
	get.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	del := &cobra.Command{
		Use:   "delete",
		Short: "Delete the tap policy and its contracts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := a.client.DeleteTapPolicy(contextOf(cmd))
			if err != nil {
				return err
			}
			a.printChanges(res)
			return nil
		},
	}
	cmd.AddCommand(apply, get, del)
	return cmd
}

func (a *app) tapCompile() *cobra.Command {
	var file, output string
	var explain, facts bool
	cmd := &cobra.Command{
		Use:   "compile -f FILE [--explain] [--facts]",
		Short: "Compile a tap policy against the agent's current facts and show what it would yield; nothing is applied",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := a.readTapPolicy(file)
			if err != nil {
				return err
			}
			req.Explain, req.Facts = explain, facts
			p, err := a.client.CompileTapPolicy(contextOf(cmd), req)
			if err != nil {
				return err
			}
			if output == "json" {
				return a.printJSON(p)
			}
			if facts {
				a.printf("facts (%d):\n", len(p.Facts))
				for _, f := range p.Facts {
					a.printf("  %s\n", f)
				}
			}
			a.printf("tap policy %s (placement %s)\n", p.File, p.Strategy)
			a.printCompiled(p, explain)
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&file, "filename", "f", "", "the policy file (Datalog), or - for stdin")
	fl.BoolVar(&explain, "explain", false, "show each contract's derivations: rule, line, facts matched, derived premises, placement")
	fl.BoolVar(&facts, "facts", false, "print the facts the agent derived, which the policy is evaluated over")
	fl.StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

// printCompiled prints a tap policy's contracts and unplaced requests, with their
// derivations when explain.
func (a *app) printCompiled(p api.TapPolicy, explain bool) {
	a.printf("%s:\n", count(len(p.Contracts), "contract"))
	for _, c := range p.Contracts {
		port := "any port"
		if c.Port != 0 {
			port = fmt.Sprintf("port %d", c.Port)
		}
		a.printf("  %s: %s %s %s %s %s -> %s (tap contracts %s)\n", c.Name, c.Action, c.Source, c.Direction, c.Protocol, port, c.Monitor, strings.Join(c.Taps, ", "))
		if !explain {
			continue
		}
		if c.Placement != "" {
			a.printf("    placed: %s\n", c.Placement)
		}
		a.printDerivations(c.Why, "    ")
	}
	if len(p.Missing) > 0 {
		a.printf("nothing derived; what the rules toward tap and inspect need (the facts: --facts):\n")
		for _, m := range p.Missing {
			a.printf("  %s\n", m)
		}
	}
	if len(p.Unplaced) > 0 {
		a.printf("%s no monitor could take:\n", count(len(p.Unplaced), "request"))
	}
	for _, u := range p.Unplaced {
		a.printf("  %s: %s\n", u.Request, u.Reason)
		if explain {
			a.printDerivations(u.Why, "    ")
		}
	}
}

func (a *app) printDerivations(ds []api.TapDerivation, indent string) {
	for _, d := range ds {
		a.printf("%sby rule at line %d: %s\n", indent, d.Line, d.Rule)
		derived := map[string]bool{}
		for _, p := range d.Derived {
			derived[p.Fact] = true
		}
		for _, f := range d.Facts {
			if !derived[f] { // a derived premise is shown below with its derivations
				a.printf("%s  %s\n", indent, f)
			}
		}
		for _, p := range d.Derived {
			a.printf("%s  %s, derived:\n", indent, p.Fact)
			a.printDerivations(p.Why, indent+"    ")
		}
	}
}

// count is "1 thing" or "n things".
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
