//go:build race

package alloc

const race = true
