package benchkit

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
)

// Float is a float64 that encodes NaN and infinities (no sample, no baseline) as JSON null,
// which encoding/json refuses to write for a float64, and decodes null back to NaN.
type Float float64

// NaN is a Float with no value.
func NaN() Float { return Float(math.NaN()) }

// Valid reports whether f holds a number.
func (f Float) Valid() bool { return !math.IsNaN(float64(f)) && !math.IsInf(float64(f), 0) }

// MarshalJSON implements json.Marshaler.
func (f Float) MarshalJSON() ([]byte, error) {
	if !f.Valid() {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, float64(f), 'g', -1, 64), nil
}

// UnmarshalJSON implements json.Unmarshaler.
func (f *Float) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		*f = NaN()
		return nil
	}
	var v float64
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*f = Float(v)
	return nil
}
