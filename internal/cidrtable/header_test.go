package cidrtable

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
)

// TestHeaderConstants checks the Go mirrors of the CIDR set #defines of rampart.h (which
// bpf2go does not export) against their C values.
func TestHeaderConstants(t *testing.T) {
	src, err := os.ReadFile("../../bpf/include/rampart.h")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]uint64{
		"CIDR_MAX_PROBE":      cidrMaxProbe,
		"CIDR_TOP_ROWS":       cidrTopRows,
		"CIDR_HOST_MIN_SLOTS": MinHostSlots,
		"CIDR_HOST_BUCKET":    cidrHostBucket,
		"RAMPART_CIDR_SETS":   cidrSets,
		"ID_CIDR_SET_FIRST":   cidrSetFirst,
	} {
		// A number, or (1u << n).
		m := regexp.MustCompile(`(?m)^#define\s+` + name + `\s+(?:\(1u?\s*<<\s*(\d+)\)|([0-9a-fA-Fx]+)u?)\s*$`).FindSubmatch(src)
		if m == nil {
			t.Errorf("%s not found in rampart.h", name)
			continue
		}
		var got uint64
		if len(m[1]) > 0 {
			n, _ := strconv.Atoi(string(m[1]))
			got = 1 << n
		} else if got, err = strconv.ParseUint(string(m[2]), 0, 64); err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if got != want {
			t.Errorf("%s = %d in rampart.h, %d in Go", name, got, want)
		}
	}
	if cidrSetFirst != identity.FirstCIDRSet || cidrSets != identity.MaxCIDRSets {
		t.Errorf("the CIDR set constants differ from identity's")
	}
}
