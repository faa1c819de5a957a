package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io/ioutil"
	"log"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Internal mutual TLS, as the Python services do it (core/tls.py, core/callers.py): the door
// presents its own certificate (identity spiffe://tiermesh/frontdoor) to the router and the
// gateway's books, trusts only the internal CA, and its Delivery port takes calls only from
// a certificate of that CA naming postprocess or a worker (which delivers the batches that
// need no postprocessing itself).
const identityPrefix = "spiffe://tiermesh/"

// Who may call the door's Delivery port (core/callers.py's CALLERS).
var deliveryCallers = map[string]bool{identityPrefix + "postprocess": true, identityPrefix + "worker": true}

// internalTLS is the door's side of the mesh's internal mTLS; nil: plaintext.
type internalTLS struct {
	cert tls.Certificate
	ca   *x509.CertPool
}

// loadInternalTLS reads TIERMESH_INTERNAL_TLS_{CA,CERT,KEY}_FILE: all three or none.
func loadInternalTLS() (*internalTLS, error) {
	keys := []string{"TIERMESH_INTERNAL_TLS_CA_FILE", "TIERMESH_INTERNAL_TLS_CERT_FILE", "TIERMESH_INTERNAL_TLS_KEY_FILE"}
	var files []string
	for _, key := range keys {
		if v := env(key, ""); v != "" {
			files = append(files, v)
		}
	}
	if len(files) == 0 {
		return nil, nil
	}
	if len(files) != len(keys) {
		return nil, fmt.Errorf("internal mutual TLS: set %v together", keys)
	}
	pem, err := ioutil.ReadFile(files[0])
	if err != nil {
		return nil, fmt.Errorf("CA file %s: %v", files[0], err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("CA file %s: no PEM certificate in it", files[0])
	}
	cert, err := tls.LoadX509KeyPair(files[1], files[2])
	if err != nil {
		return nil, fmt.Errorf("certificate %s and key %s: %v", files[1], files[2], err)
	}
	return &internalTLS{cert: cert, ca: pool}, nil
}

// dialOption: TLS to an internal server (verified against the internal CA by the address's
// host, as grpcio does), presenting the door's certificate; plaintext without internal TLS.
func (t *internalTLS) dialOption() grpc.DialOption {
	if t == nil {
		return grpc.WithInsecure()
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{t.cert},
		RootCAs:      t.ca,
		MinVersion:   tls.VersionTLS12,
	}))
}

// serverOptions of the door's Delivery port: mutual TLS (a client certificate of the
// internal CA is required) and only postprocess's calls reach the servicer.
func (t *internalTLS) serverOptions() []grpc.ServerOption {
	if t == nil {
		return nil
	}
	creds := credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{t.cert},
		ClientCAs:    t.ca,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	})
	unary := func(ctx context.Context, req interface{}, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (interface{}, error) {
		if err := callerAllowed(ctx); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
	stream := func(srv interface{}, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if err := callerAllowed(ss.Context()); err != nil {
			return err
		}
		return h(srv, ss)
	}
	return []grpc.ServerOption{grpc.Creds(creds), grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream)}
}

// callerAllowed: the call's peer presented a certificate naming a deliveryCallers identity.
func callerAllowed(ctx context.Context) error {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return status.Error(codes.Unauthenticated, "internal calls need mutual TLS")
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.PeerCertificates) == 0 {
		return status.Error(codes.Unauthenticated, "internal calls need mutual TLS")
	}
	for _, uri := range info.State.PeerCertificates[0].URIs {
		if deliveryCallers[uri.String()] {
			return nil
		}
	}
	return status.Error(codes.PermissionDenied, "tiermesh.v1.Delivery takes calls from "+
		identityPrefix+"postprocess and "+identityPrefix+"worker only")
}

func mustInternalTLS() *internalTLS {
	t, err := loadInternalTLS()
	if err != nil {
		log.Fatalf("%v", err)
	}
	return t
}
