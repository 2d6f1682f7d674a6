package cli_test

import "github.com/rampartnet/rampart/internal/agent"

func newAgent(cfg agent.Config) (*agent.Agent, error) { return agent.New(cfg) }
