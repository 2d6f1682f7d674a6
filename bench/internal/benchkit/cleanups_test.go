package benchkit

import (
	"errors"
	"slices"
	"testing"
)

// Steps run last added first, every one of them even after one fails, and their errors
// come back in that order.
func TestCleanupsRunInReverse(t *testing.T) {
	var ran []int
	var c Cleanups
	for i := range 3 {
		c.Add(func() error {
			ran = append(ran, i)
			if i == 1 {
				return errors.New("step 1")
			}
			return nil
		})
	}
	errs := c.Run()
	if !slices.Equal(ran, []int{2, 1, 0}) {
		t.Errorf("ran %v, want 2 1 0", ran)
	}
	if len(errs) != 1 || errs[0].Error() != "step 1" {
		t.Errorf("errors %v, want step 1's", errs)
	}
}
