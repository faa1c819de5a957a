package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"sync"
)

// textPlan is how the door may tokenize a text model's input itself, as the router's
// `tokenizers` would (core/direct_plan.py decides from the tokenizer.json that the model
// has this shape: BertNormalizer, BertPreTokenizer, WordPiece, [CLS] text [SEP]).
type textPlan struct {
	File      string       `json:"file"`   // the version's tokenizer.json
	Sha256    string       `json:"sha256"` // as the repository checked it
	MaxLength int          `json:"max_length"`
	Lowercase bool         `json:"lowercase"`
	Prefix    string       `json:"prefix"`
	Unknown   string       `json:"unk_token"`
	MaxChars  int          `json:"max_input_chars_per_word"`
	First     int64        `json:"first"` // the id before the text ([CLS])
	Last      int64        `json:"last"`  // the id after it ([SEP])
	Added     []addedToken `json:"added"` // matched in the raw text before anything else
	Input     string       `json:"input"` // the text input's name
	IdsName   string       `json:"ids"`   // the compute inputs the router writes
	MaskName  string       `json:"mask"`
	Truncated string       `json:"truncated"` // the annotation that tells the caller
}

type addedToken struct {
	Content string `json:"content"`
	ID      int64  `json:"id"`
}

// wordPiece tokenizes ASCII texts exactly as the router does: what a BertNormalizer does
// to ASCII (control characters dropped, tab and line ends to spaces, lower case), words
// split at whitespace and ASCII punctuation, each word's longest known pieces first. A text
// with any other byte is the router's: its Unicode tables (accents, categories, CJK) are
// the tokenizers library's, not Go's.
type wordPiece struct {
	plan    *textPlan
	vocab   map[string]int64
	unknown int64
}

// Vocabularies by file digest: a model's config is read again every 30 s, its
// tokenizer.json once.
var vocabularies sync.Map

func loadWordPiece(plan *textPlan) (*wordPiece, error) {
	if plan.MaxLength < 2 || plan.Prefix == "" || plan.IdsName == "" || plan.MaskName == "" || plan.Truncated == "" {
		return nil, fmt.Errorf("a text plan without max_length, prefix or the names it writes")
	}
	vocab, err := vocabularyOf(plan)
	if err != nil {
		return nil, err
	}
	unknown, ok := vocab[plan.Unknown]
	if !ok {
		return nil, fmt.Errorf("%s: no %q in its vocabulary", plan.File, plan.Unknown)
	}
	return &wordPiece{plan: plan, vocab: vocab, unknown: unknown}, nil
}

// vocabularyOf is the WordPiece vocabulary of the plan's tokenizer.json, once its digest is
// the one the gateway checked.
func vocabularyOf(plan *textPlan) (map[string]int64, error) {
	if found, ok := vocabularies.Load(plan.Sha256); ok {
		return found.(map[string]int64), nil
	}
	data, err := os.ReadFile(plan.File)
	if err != nil {
		return nil, err
	}
	digest := sha256.Sum256(data)
	if hex.EncodeToString(digest[:]) != plan.Sha256 {
		return nil, fmt.Errorf("%s changed since the gateway checked it", plan.File)
	}
	var file struct {
		Model struct {
			Vocab map[string]int64 `json:"vocab"`
		} `json:"model"`
	}
	if err := json.Unmarshal(data, &file); err != nil {
		return nil, fmt.Errorf("%s: %v", plan.File, err)
	}
	vocabularies.Store(plan.Sha256, file.Model.Vocab)
	return file.Model.Vocab, nil
}

// encode is the text's ids, [first] pieces [last], cut to max_length (truncated says so),
// or ok=false for a text that is not ASCII.
func (wp *wordPiece) encode(text []byte) (ids []int64, truncated, ok bool) {
	for _, c := range text {
		if c >= 0x80 {
			return nil, false, false
		}
	}
	ids = append(make([]int64, 0, len(text)/3+2), wp.plan.First)
	for len(text) > 0 {
		at, token := wp.nextAdded(text)
		ids = wp.words(ids, text[:at])
		if token == nil {
			break
		}
		ids = append(ids, token.ID)
		text = text[at+len(token.Content):]
	}
	if keep := wp.plan.MaxLength - 1; len(ids) > keep {
		ids, truncated = ids[:keep], true
	}
	return append(ids, wp.plan.Last), truncated, true
}

// nextAdded is where the first added token starts in text (the longest of those starting
// there), or len(text) and nil.
func (wp *wordPiece) nextAdded(text []byte) (int, *addedToken) {
	best, at := (*addedToken)(nil), len(text)
	for i := range wp.plan.Added {
		t := &wp.plan.Added[i]
		if t.Content == "" {
			continue
		}
		j := bytes.Index(text[:min(len(text), at+len(t.Content))], []byte(t.Content))
		if j >= 0 && (j < at || (j == at && best != nil && len(t.Content) > len(best.Content))) {
			best, at = t, j
		}
	}
	return at, best
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

// words appends the pieces of each word of an ASCII span (normalised here).
func (wp *wordPiece) words(ids []int64, span []byte) []int64 {
	word := make([]byte, 0, 32)
	flush := func() {
		if len(word) > 0 {
			ids = wp.pieces(ids, word)
			word = word[:0]
		}
	}
	for _, c := range span {
		switch {
		case c == '\t' || c == '\n' || c == '\r' || c == ' ':
			flush()
		case c < 0x20 || c == 0x7f: // control characters (NUL included) are dropped
		case isASCIIPunctuation(c):
			flush()
			ids = wp.pieces(ids, []byte{c})
		default:
			if wp.plan.Lowercase && c >= 'A' && c <= 'Z' {
				c += 'a' - 'A'
			}
			word = append(word, c)
		}
	}
	flush()
	return ids
}

func isASCIIPunctuation(c byte) bool {
	return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~')
}

// pieces appends a word's WordPiece ids: the longest known prefix, then the longest known
// continuation (with the prefix) and so on; a word with a part no piece matches, or longer
// than max_input_chars_per_word, is the unknown token.
func (wp *wordPiece) pieces(ids []int64, word []byte) []int64 {
	if wp.plan.MaxChars > 0 && len(word) > wp.plan.MaxChars {
		return append(ids, wp.unknown)
	}
	start, at := len(ids), 0
	key := make([]byte, 0, len(wp.plan.Prefix)+len(word))
	for at < len(word) {
		found := false
		for end := len(word); end > at; end-- {
			key = key[:0]
			if at > 0 {
				key = append(key, wp.plan.Prefix...)
			}
			key = append(key, word[at:end]...)
			if id, ok := wp.vocab[string(key)]; ok {
				ids = append(ids, id)
				at, found = end, true
				break
			}
		}
		if !found {
			return append(ids[:start], wp.unknown)
		}
	}
	return ids
}

// tokenized is the request's text tensor as the router's (input_ids, attention_mask): one
// row per text, padded with 0 to the longest (core/text.py); ok=false when any text is
// not the door's to tokenize.
func (wp *wordPiece) tokenized(texts []byte, rows int64) (ids, mask []byte, length int64, truncated, ok bool) {
	all := make([][]int64, 0, rows)
	for i := int64(0); i < rows; i++ {
		if len(texts) < 4 || uint64(len(texts)-4) < uint64(binary.LittleEndian.Uint32(texts)) {
			return nil, nil, 0, false, false // not BYTES framing (the door checked it already)
		}
		n := 4 + int(binary.LittleEndian.Uint32(texts))
		row, cut, fine := wp.encode(texts[4:n])
		if !fine {
			return nil, nil, 0, false, false
		}
		texts = texts[n:]
		all = append(all, row)
		truncated = truncated || cut
		if int64(len(row)) > length {
			length = int64(len(row))
		}
	}
	ids = make([]byte, 8*rows*length)
	mask = make([]byte, 8*rows*length)
	for i, row := range all {
		base := 8 * int64(i) * length
		for j, id := range row {
			binary.LittleEndian.PutUint64(ids[base+8*int64(j):], uint64(id))
			binary.LittleEndian.PutUint64(mask[base+8*int64(j):], 1)
		}
	}
	return ids, mask, length, truncated, true
}
