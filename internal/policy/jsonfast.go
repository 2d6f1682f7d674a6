package policy

import (
	"bytes"
	"encoding/json"
	"errors"

	"gopkg.in/yaml.v3"
)

// readValidJSON builds the same tree as readJSON for a text that json.Valid accepts, in
// one pass over the bytes instead of one json.Decoder token at a time: the decoder's
// tokens cost three times as much (BenchmarkParse10kRules/json), and JSON is how the
// agent reads its stored policies (PolicyRecord.Raw, parsed again at every start) and
// accepted versions, besides JSON manifests. (Kubernetes objects no longer pass through
// JSON: ParseObject.) It checks the syntax as it reads,
// as json.Valid does (the tests hold it to json.Valid), and the nesting, and returns
// errNotValidJSON for a text that json.Valid refuses or that nests deeper than MaxDepth:
// readDocuments then checks the limits and the syntax again to say which.
//
// Strings without escapes and non-ASCII bytes are taken as they are; the others are
// decoded by encoding/json, as readJSON's decoder does (invalid UTF-8 becomes U+FFFD).
//
// It also returns the document's compact JSON when writeJSON would render the tree to the
// same bytes (see canon), else nil: then the whitespace between tokens is all that differs,
// and dropping it while scanning costs far less than walking the tree again. A large
// policy's rendering is otherwise a tenth of an apply's work.
func readValidJSON(data []byte) (*yaml.Node, []byte, error) {
	s := &jsonScanner{data: data, line: 1, canon: true, raw: make([]byte, 0, len(data))}
	n, err := s.value()
	if err != nil {
		return nil, nil, err
	}
	s.space()
	if s.i != len(data) {
		return nil, nil, errNotValidJSON
	}
	if !s.canon {
		return n, nil, nil
	}
	s.raw = append(s.raw, data[s.run:s.i]...)
	return n, s.raw, nil
}

// errNotValidJSON is readValidJSON's answer to a text that json.Valid refuses or that
// nests too deep.
var errNotValidJSON = errors.New("not valid JSON")

type jsonScanner struct {
	data []byte
	i    int
	line int
	// depth counts the collections open around s.i (error returns leave it: the scanner
	// is dropped then).
	depth int
	// raw is the compact text so far: data up to run without the whitespace between
	// tokens. canon is false once a token was seen that writeJSON renders otherwise
	// (escapes, non-ASCII, HTML characters, numbers not in the form FormatInt writes).
	raw   []byte
	run   int
	canon bool
	treeBuilder
}

func (s *jsonScanner) space() {
	if s.i < len(s.data) && !isJSONSpace(s.data[s.i]) {
		return
	}
	if s.canon {
		s.raw = append(s.raw, s.data[s.run:s.i]...)
	}
	for s.i < len(s.data) && isJSONSpace(s.data[s.i]) {
		if s.data[s.i] == '\n' {
			s.line++
		}
		s.i++
	}
	s.run = s.i
}

// peek is the byte at s.i, or 0 at the end (never valid where a token is expected).
func (s *jsonScanner) peek() byte {
	if s.i < len(s.data) {
		return s.data[s.i]
	}
	return 0
}

func (s *jsonScanner) value() (*yaml.Node, error) {
	s.space()
	line := s.line
	switch c := s.peek(); c {
	case '{':
		n := s.node(yaml.MappingNode, "!!map", "", yaml.FlowStyle, line, 0)
		if s.depth++; s.depth > MaxDepth {
			return nil, errNotValidJSON
		}
		s.i++
		s.space()
		if s.peek() == '}' {
			s.i++
			s.depth--
			return n, nil
		}
		from := len(s.kids)
		for {
			s.space()
			if s.peek() != '"' {
				return nil, errNotValidJSON
			}
			kline := s.line
			k, err := s.str()
			if err != nil {
				return nil, err
			}
			// The key's node before the value's: the checker reads them together, and
			// nodes taken in that order share cache lines.
			kn := s.node(yaml.ScalarNode, "!!str", k, yaml.DoubleQuotedStyle, kline, 0)
			s.space()
			if s.peek() != ':' {
				return nil, errNotValidJSON
			}
			s.i++
			v, err := s.value()
			if err != nil {
				return nil, err
			}
			s.kids = append(s.kids, kn, v)
			if closed, err := s.next('}'); err != nil || closed {
				n.Content = s.content(from)
				return n, err
			}
		}
	case '[':
		n := s.node(yaml.SequenceNode, "!!seq", "", yaml.FlowStyle, line, 0)
		if s.depth++; s.depth > MaxDepth {
			return nil, errNotValidJSON
		}
		s.i++
		s.space()
		if s.peek() == ']' {
			s.i++
			s.depth--
			return n, nil
		}
		from := len(s.kids)
		for {
			v, err := s.value()
			if err != nil {
				return nil, err
			}
			s.kids = append(s.kids, v)
			if closed, err := s.next(']'); err != nil || closed {
				n.Content = s.content(from)
				return n, err
			}
		}
	case '"':
		v, err := s.str()
		if err != nil {
			return nil, err
		}
		return s.node(yaml.ScalarNode, "!!str", v, yaml.DoubleQuotedStyle, line, 0), nil
	case 't':
		return s.literal("true", "!!bool", line)
	case 'f':
		return s.literal("false", "!!bool", line)
	case 'n':
		return s.literal("null", "!!null", line)
	}
	return s.number(line)
}

// next takes the ',' after an item of a collection, or its closer: closed says which.
func (s *jsonScanner) next(closer byte) (closed bool, err error) {
	s.space()
	switch s.peek() {
	case ',':
		s.i++
		return false, nil
	case closer:
		s.i++
		s.depth--
		return true, nil
	}
	return false, errNotValidJSON
}

func (s *jsonScanner) literal(word, tag string, line int) (*yaml.Node, error) {
	if !bytes.HasPrefix(s.data[s.i:], []byte(word)) {
		return nil, errNotValidJSON
	}
	s.i += len(word)
	return s.node(yaml.ScalarNode, tag, word, 0, line, 0), nil
}

func isJSONSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\r' || c == '\n'
}

// canonInt reports whether writeJSON writes the integer text v as it is: what decodeInt
// takes without yaml.v3 and FormatInt writes back the same.
func canonInt(v []byte) bool {
	digits := v
	if len(v) > 0 && v[0] == '-' {
		digits = v[1:]
		if len(digits) > 0 && digits[0] == '0' {
			return false // -0
		}
	}
	if len(digits) == 0 || len(digits) > 18 || digits[0] == '0' && len(digits) > 1 {
		return false
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// number reads a number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *jsonScanner) number(line int) (*yaml.Node, error) {
	start, tag := s.i, "!!int"
	digits := func() bool {
		from := s.i
		for s.i < len(s.data) && '0' <= s.data[s.i] && s.data[s.i] <= '9' {
			s.i++
		}
		return s.i > from
	}
	if s.peek() == '-' {
		s.i++
	}
	switch c := s.peek(); {
	case c == '0':
		s.i++
	case '1' <= c && c <= '9':
		digits()
	default:
		return nil, errNotValidJSON
	}
	if s.peek() == '.' {
		tag = "!!float"
		s.i++
		if !digits() {
			return nil, errNotValidJSON
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		tag = "!!float"
		s.i++
		if c := s.peek(); c == '+' || c == '-' {
			s.i++
		}
		if !digits() {
			return nil, errNotValidJSON
		}
	}
	v := s.data[start:s.i]
	if tag != "!!int" || !canonInt(v) {
		s.canon = false // writeJSON formats it anew
	}
	return s.node(yaml.ScalarNode, tag, string(v), 0, line, 0), nil
}

// str reads the string at s.i (its opening quote).
func (s *jsonScanner) str() (string, error) {
	start := s.i
	s.i++
	plain := true
	for s.i < len(s.data) {
		c := s.data[s.i]
		switch {
		case c == '"':
			s.i++
			if plain {
				return string(s.data[start+1 : s.i-1]), nil
			}
			var v string
			if err := json.Unmarshal(s.data[start:s.i], &v); err != nil {
				return "", &syntaxError{doc: 1, line: s.line, reason: "invalid JSON: " + err.Error()}
			}
			return v, nil
		case c == '\\':
			plain = false
			s.canon = false
			if s.i+1 >= len(s.data) {
				return "", errNotValidJSON
			}
			switch s.data[s.i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.i += 2
			case 'u':
				if s.i+6 > len(s.data) {
					return "", errNotValidJSON
				}
				for _, h := range s.data[s.i+2 : s.i+6] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return "", errNotValidJSON
					}
				}
				s.i += 6
			default:
				return "", errNotValidJSON
			}
		case c < 0x20:
			return "", errNotValidJSON
		case c >= 0x80:
			plain = false
			s.canon = false
			s.i++
		case c == '<' || c == '>' || c == '&':
			s.canon = false // writeJSONString escapes them
			s.i++
		default:
			s.i++
		}
	}
	return "", errNotValidJSON
}
