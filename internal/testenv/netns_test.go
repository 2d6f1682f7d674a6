package testenv

import (
	"errors"
	"os"
	"testing"

	"github.com/vishvananda/netns"
)

// TestNewNetnsAndInNetns creates a namespace, runs code in it (on another namespace than
// the test's own), and checks that the namespace is gone once its test has ended.
func TestNewNetnsAndInNetns(t *testing.T) {
	RequireRoot(t)
	name := "rpt-te-" + Suffix(8)
	var path string
	t.Run("use", func(t *testing.T) {
		path = NewNetns(t, name)
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("namespace not mounted: %v", err)
		}
		own, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer own.Close()
		var inside netns.NsHandle
		if err := InNetns(path, func() (err error) { inside, err = netns.Get(); return err }); err != nil {
			t.Fatal(err)
		}
		defer inside.Close()
		if inside.Equal(own) {
			t.Error("InNetns ran fn in the test's own namespace")
		}
		after, err := netns.Get()
		if err != nil {
			t.Fatal(err)
		}
		defer after.Close()
		if !after.Equal(own) {
			t.Error("the test's goroutine changed namespace")
		}
	})
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still there after its test ended (err %v)", path, err)
	}
}
