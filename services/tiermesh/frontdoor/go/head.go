package main

import (
	"github.com/golang/protobuf/proto"
	"inference"
)

// head is what the door reads of a ModelInfer request before it admits it: the fields
// that name its class (model, version, parameters) and its id, never its tensors. A
// refusal is decided from the head alone; only an admitted request is parsed whole.
type head struct {
	model, version, id string
	params             map[string]*inference.InferParameter
}

// ModelInferRequest's field numbers (grpc_service.proto) and the wire types read here.
const (
	fieldModelName    = 1
	fieldModelVersion = 2
	fieldID           = 3
	fieldParameters   = 4
	wireVarint        = 0
	wireFixed64       = 1
	wireBytes         = 2
	wireFixed32       = 5
)

// headOf reads a serialized ModelInferRequest's head, skipping every other field as bytes;
// ok is false for bytes that are not a well-formed message of the kinds read here (the
// full parse then decides what becomes of it). A field given twice keeps its last value,
// as a protobuf parser does.
func headOf(b []byte) (h head, ok bool) {
	for len(b) > 0 {
		tag, n := proto.DecodeVarint(b)
		if n == 0 {
			return h, false
		}
		b = b[n:]
		var value []byte
		switch tag & 7 {
		case wireVarint:
			if _, n = proto.DecodeVarint(b); n == 0 {
				return h, false
			}
			b = b[n:]
			continue
		case wireFixed64, wireFixed32:
			size := 8
			if tag&7 == wireFixed32 {
				size = 4
			}
			if len(b) < size {
				return h, false
			}
			b = b[size:]
			continue
		case wireBytes:
			if value, b, ok = lengthDelimited(b); !ok {
				return h, false
			}
		default: // groups: nothing in this message
			return h, false
		}
		switch tag >> 3 {
		case fieldModelName:
			h.model = string(value)
		case fieldModelVersion:
			h.version = string(value)
		case fieldID:
			h.id = string(value)
		case fieldParameters:
			key, param, good := parameterEntry(value)
			if !good {
				return h, false
			}
			if h.params == nil {
				h.params = map[string]*inference.InferParameter{}
			}
			h.params[key] = param
		}
	}
	return h, true
}

// lengthDelimited splits a length-prefixed value off b.
func lengthDelimited(b []byte) (value, rest []byte, ok bool) {
	size, n := proto.DecodeVarint(b)
	if n == 0 || size > uint64(len(b)-n) {
		return nil, nil, false
	}
	end := n + int(size)
	return b[n:end], b[end:], true
}

// parameterEntry is one entry of the parameters map: key (field 1) and InferParameter
// value (field 2; absent, an empty one, as a protobuf parser gives).
func parameterEntry(b []byte) (string, *inference.InferParameter, bool) {
	var key string
	param := &inference.InferParameter{}
	for len(b) > 0 {
		tag, n := proto.DecodeVarint(b)
		if n == 0 || tag&7 != wireBytes {
			return "", nil, false
		}
		value, rest, ok := lengthDelimited(b[n:])
		if !ok {
			return "", nil, false
		}
		b = rest
		switch tag >> 3 {
		case 1:
			key = string(value)
		case 2:
			param = &inference.InferParameter{}
			if proto.Unmarshal(value, param) != nil {
				return "", nil, false
			}
		}
	}
	return key, param, true
}
