// The bare KServe v2 ModelInfer servicer of benchmarks/grpc_hops.py, in Go (grpc-go): the
// same answer (a 1x384 FP32 output of zeros, the request's model name and id), so that
// grpc_hops.py --go measures what one public call costs a compiled gRPC server against
// Python's grpc.aio on the same client load. Prints its port on stdout, serves until killed.
package main

import (
	"context"
	"fmt"
	"net"
	"os"

	"google.golang.org/grpc"
	"inference"
)

type server struct {
	inference.UnimplementedGRPCInferenceServiceServer
}

var embedding = make([]byte, 384*4)

func (s *server) ModelInfer(ctx context.Context, req *inference.ModelInferRequest) (*inference.ModelInferResponse, error) {
	out := &inference.ModelInferResponse_InferOutputTensor{
		Name: "sentence_embedding", Datatype: "FP32", Shape: []int64{1, 384},
	}
	return &inference.ModelInferResponse{
		ModelName:         req.ModelName,
		Id:                req.Id,
		Outputs:           []*inference.ModelInferResponse_InferOutputTensor{out},
		RawOutputContents: [][]byte{embedding},
	}, nil
}

func main() {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(lis.Addr().(*net.TCPAddr).Port)
	s := grpc.NewServer(grpc.MaxRecvMsgSize(1 << 26))
	inference.RegisterGRPCInferenceServiceServer(s, &server{})
	if err := s.Serve(lis); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
