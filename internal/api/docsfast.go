package api

// decodeDocumentsFast decodes the body of an apply request, {"documents":[{"source":
// "...","data":"..."}, ...]}, in one pass over the bytes, or reports false. encoding/json
// scans a body twice and unquotes a manifest string through its generic machinery: for a
// 10,000-rule policy that was about a tenth of the agent's work on the request.
//
// It only takes the form the client writes: those keys spelled exactly, each once, strings
// of printable ASCII with the escapes \" \\ \/ \b \f \n \r \t. Anything else
// (other keys, \u escapes, non-ASCII, invalid JSON) reports false and goes to
// encoding/json, whose result and errors are the API's definition; what this decodes is
// what encoding/json decodes (held to it by the tests).
func decodeDocumentsFast(b []byte, req *ApplyRequest) bool {
	p := docParser{b: b}
	p.space()
	if !p.lit("{") || !p.key("documents") || !p.lit("[") {
		return false
	}
	docs := []Document{}
	if !p.lit("]") {
		for {
			d, ok := p.document()
			if !ok {
				return false
			}
			docs = append(docs, d)
			if p.lit("]") {
				break
			}
			if !p.lit(",") {
				return false
			}
		}
	}
	if !p.lit("}") || p.i != len(b) {
		return false
	}
	req.Documents = docs
	return true
}

type docParser struct {
	b []byte
	i int
}

func (p *docParser) space() {
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// lit takes the byte s (and the spaces after it) if it comes next.
func (p *docParser) lit(s string) bool {
	if p.i < len(p.b) && p.b[p.i] == s[0] {
		p.i++
		p.space()
		return true
	}
	return false
}

// key takes "name" and its colon.
func (p *docParser) key(name string) bool {
	s, ok := p.str()
	return ok && s == name && p.lit(":")
}

func (p *docParser) document() (Document, bool) {
	var d Document
	if !p.lit("{") {
		return d, false
	}
	var seenSource, seenData bool
	for {
		k, ok := p.str()
		if !ok || !p.lit(":") {
			return d, false
		}
		v, ok := p.str()
		if !ok {
			return d, false
		}
		switch {
		case k == "source" && !seenSource:
			d.Source, seenSource = v, true
		case k == "data" && !seenData:
			d.Data, seenData = v, true
		default:
			return d, false
		}
		if p.lit("}") {
			return d, true
		}
		if !p.lit(",") {
			return d, false
		}
	}
}

// str reads a string and the spaces after it.
func (p *docParser) str() (string, bool) {
	b := p.b
	if p.i >= len(b) || b[p.i] != '"' {
		return "", false
	}
	start := p.i + 1
	i := start
	// Up to the first escape, the string is the input's bytes.
	for i < len(b) && b[i] != '"' && b[i] != '\\' {
		if c := b[i]; c < 0x20 || c >= 0x7f {
			return "", false
		}
		i++
	}
	if i >= len(b) {
		return "", false
	}
	if b[i] == '"' {
		p.i = i + 1
		p.space()
		return string(b[start:i]), true
	}
	// The closing quote bounds the decoded length.
	end := i
	for end < len(b) && b[end] != '"' {
		if b[end] == '\\' {
			end++
		}
		end++
	}
	out := make([]byte, 0, min(end, len(b))-start)
	out = append(out, b[start:i]...)
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			p.i = i + 1
			p.space()
			return string(out), true
		case c == '\\':
			if i+1 >= len(b) {
				return "", false
			}
			switch e := b[i+1]; e {
			case '"', '\\', '/':
				out = append(out, e)
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			default:
				return "", false
			}
			i += 2
		case c < 0x20 || c >= 0x7f:
			return "", false
		default:
			out = append(out, c)
			i++
		}
	}
	return "", false
}
