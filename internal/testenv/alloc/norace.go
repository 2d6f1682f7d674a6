//go:build !race

package alloc

const race = false
