package policy

import (
	"encoding/json"

	"gopkg.in/yaml.v3"
)

// readValidJSON builds the same tree as readJSON for a text that json.Valid accepts, in
// one pass over the bytes instead of one json.Decoder token at a time: the decoder's
// tokens cost as much as YAML parsing, and JSON is how Kubernetes objects reach the
// parser (docs/benchmarks.md, "Apply to enforcement"). Invalid input must go to readJSON,
// whose errors name the problem; this scanner assumes valid syntax.
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
	if !s.canon {
		return n, nil, nil
	}
	s.raw = append(s.raw, data[s.run:s.i]...)
	return n, s.raw, nil
}

type jsonScanner struct {
	data []byte
	i    int
	line int
	// nodes is a slab the tree's nodes are taken from: one allocation per 256 nodes.
	nodes []yaml.Node
	// raw is the compact text so far: data up to run without the whitespace between
	// tokens. canon is false once a token was seen that writeJSON renders otherwise
	// (escapes, non-ASCII, HTML characters, numbers not in the form FormatInt writes).
	raw   []byte
	run   int
	canon bool
}

func (s *jsonScanner) node(kind yaml.Kind, tag, value string, style yaml.Style, line int) *yaml.Node {
	if len(s.nodes) == 0 {
		s.nodes = make([]yaml.Node, 256)
	}
	n := &s.nodes[0]
	s.nodes = s.nodes[1:]
	n.Kind, n.Tag, n.Value, n.Style, n.Line = kind, tag, value, style, line
	return n
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

func (s *jsonScanner) value() (*yaml.Node, error) {
	s.space()
	line := s.line
	switch c := s.data[s.i]; c {
	case '{':
		n := s.node(yaml.MappingNode, "!!map", "", yaml.FlowStyle, line)
		s.i++
		for {
			s.space()
			switch s.data[s.i] {
			case '}':
				s.i++
				return n, nil
			case ',':
				s.i++
				s.space()
			}
			kline := s.line
			k, err := s.str()
			if err != nil {
				return nil, err
			}
			s.space()
			s.i++ // ':'
			v, err := s.value()
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, s.node(yaml.ScalarNode, "!!str", k, yaml.DoubleQuotedStyle, kline), v)
		}
	case '[':
		n := s.node(yaml.SequenceNode, "!!seq", "", yaml.FlowStyle, line)
		s.i++
		for {
			s.space()
			switch s.data[s.i] {
			case ']':
				s.i++
				return n, nil
			case ',':
				s.i++
			}
			v, err := s.value()
			if err != nil {
				return nil, err
			}
			n.Content = append(n.Content, v)
		}
	case '"':
		v, err := s.str()
		if err != nil {
			return nil, err
		}
		return s.node(yaml.ScalarNode, "!!str", v, yaml.DoubleQuotedStyle, line), nil
	case 't':
		s.i += len("true")
		return s.node(yaml.ScalarNode, "!!bool", "true", 0, line), nil
	case 'f':
		s.i += len("false")
		return s.node(yaml.ScalarNode, "!!bool", "false", 0, line), nil
	case 'n':
		s.i += len("null")
		return s.node(yaml.ScalarNode, "!!null", "null", 0, line), nil
	default: // a number
		start, tag := s.i, "!!int"
		for ; s.i < len(s.data); s.i++ {
			switch s.data[s.i] {
			case '.', 'e', 'E':
				tag = "!!float"
			case '-', '+', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
			default:
				return s.number(tag, start, line), nil
			}
		}
		return s.number(tag, start, line), nil
	}
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

func (s *jsonScanner) number(tag string, start, line int) *yaml.Node {
	v := s.data[start:s.i]
	if tag != "!!int" || !canonInt(v) {
		s.canon = false // writeJSON formats it anew
	}
	return s.node(yaml.ScalarNode, tag, string(v), 0, line)
}

// str reads the string at s.i (its opening quote).
func (s *jsonScanner) str() (string, error) {
	start := s.i
	s.i++
	plain := true
	for {
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
			s.i += 2
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
}
