package main

import (
	"io"

	"github.com/golang/protobuf/proto"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// frame is one gRPC message as its bytes: what the door passes through unread.
type frame struct{ data []byte }

// rawCodec keeps frames as bytes and codes every other message as protobuf: the public
// port reads each call's messages as frames and decides which it parses.
type rawCodec struct{}

func (rawCodec) Marshal(v interface{}) ([]byte, error) {
	if f, ok := v.(*frame); ok {
		return f.data, nil
	}
	return proto.Marshal(v.(proto.Message))
}

func (rawCodec) Unmarshal(data []byte, v interface{}) error {
	if f, ok := v.(*frame); ok {
		f.data = data
		return nil
	}
	return proto.Unmarshal(data, v.(proto.Message))
}

func (rawCodec) Name() string   { return "proto" }
func (rawCodec) String() string { return "proto" }

// proxy passes a call to the Python gateway as it came: metadata, every message both ways,
// the gateway's headers, trailers and status.
type proxy struct{ conn *grpc.ClientConn }

var bothWays = &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}

// pass forwards the call on `server`; `first` is a message already read from it (nil: none).
func (p *proxy) pass(server grpc.ServerStream, method string, first *frame) error {
	ctx := server.Context()
	md, _ := metadata.FromIncomingContext(ctx)
	out := metadata.NewOutgoingContext(ctx, md.Copy())
	client, err := p.conn.NewStream(out, bothWays, method, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return err
	}
	// Caller -> gateway until the caller half-closes; it ends with the call at the latest
	// (this handler's return cancels `out`, and the server stream's reads fail).
	go func() {
		if first != nil && client.SendMsg(first) != nil {
			return
		}
		for {
			f := &frame{}
			if err := server.RecvMsg(f); err != nil {
				if err == io.EOF {
					_ = client.CloseSend()
				}
				return
			}
			if client.SendMsg(f) != nil {
				return
			}
		}
	}()
	headerSent := false
	for {
		f := &frame{}
		err := client.RecvMsg(f)
		if !headerSent {
			if h, herr := client.Header(); herr == nil {
				_ = server.SendHeader(h)
			}
			headerSent = true
		}
		if err == io.EOF {
			server.SetTrailer(client.Trailer())
			return nil
		}
		if err != nil {
			server.SetTrailer(client.Trailer())
			return err // the gateway's own status, code and message as it sent them
		}
		if err := server.SendMsg(f); err != nil {
			return err
		}
	}
}
