package main

import (
	"compress/zlib"
	"io"

	"google.golang.org/grpc/encoding"
)

// deflate is gRPC's "deflate" message encoding (a zlib stream, as grpcio writes it), which
// grpc-go does not bring: a caller that compresses with it (tritonclient's
// compression_algorithm="deflate") is answered as the Python gateway answers it. "gzip" is
// grpc-go's own (main.go imports it).
type deflate struct{}

func (deflate) Compress(w io.Writer) (io.WriteCloser, error) { return zlib.NewWriter(w), nil }

func (deflate) Decompress(r io.Reader) (io.Reader, error) { return zlib.NewReader(r) }

func (deflate) Name() string { return "deflate" }

func init() { encoding.RegisterCompressor(deflate{}) }
