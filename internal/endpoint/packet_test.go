package endpoint

import "testing"

// A packet socket reads a monitor's interface when it is running (R 1) and bound to that
// interface or to every one; one bound elsewhere, or not running, does not.
func TestPacketSocketOn(t *testing.T) {
	const head = "sk               RefCnt Type Proto  Iface R Rmem   User   Inode\n"
	for _, c := range []struct {
		line string
		want bool
	}{
		{"ffff8881 3      3    0003   7     1 0      0      1234\n", true},
		{"ffff8881 3      3    0003   0     1 0      0      1234\n", true},
		{"ffff8881 3      3    0003   8     1 0      0      1234\n", false},
		{"ffff8881 3      3    0000   7     0 0      0      1234\n", false},
		{"", false},
	} {
		if got := packetSocketOn(head+c.line, 7); got != c.want {
			t.Errorf("%q on ifindex 7: %v, want %v", c.line, got, c.want)
		}
	}
}
