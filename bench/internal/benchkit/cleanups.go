package benchkit

// Cleanups are a run's undo steps: each set-up step adds its own, and they run in the
// reverse order, so that what was made last goes first.
type Cleanups []func() error

// Add appends an undo step.
func (c *Cleanups) Add(f func() error) { *c = append(*c, f) }

// Run runs every step, last added first, each whatever the others returned, and returns
// the errors.
func (c Cleanups) Run() []error {
	var errs []error
	for i := len(c) - 1; i >= 0; i-- {
		if err := c[i](); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}
