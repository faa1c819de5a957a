package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io/ioutil"
	"net/url"

	"github.com/gomodule/redigo/redis"
)

// redisTLS reads what a rediss:// URL asks of TLS in the query parameters redis-py reads
// (the Python services take the same URL): `ssl_ca_certs`, the CA file that signed Redis's
// certificate (else the system's), and `ssl_certfile` / `ssl_keyfile`, a client
// certificate for a Redis that asks for one. None for a redis:// URL.
func redisTLS(rawurl string) ([]redis.DialOption, error) {
	u, err := url.Parse(rawurl)
	if err != nil {
		return nil, err
	}
	if u.Scheme != "rediss" {
		return nil, nil
	}
	q := u.Query()
	config := &tls.Config{MinVersion: tls.VersionTLS12}
	if file := q.Get("ssl_ca_certs"); file != "" {
		pem, err := ioutil.ReadFile(file)
		if err != nil {
			return nil, err
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ssl_ca_certs %s: no PEM certificate in it", file)
		}
		config.RootCAs = pool
	}
	if cert, key := q.Get("ssl_certfile"), q.Get("ssl_keyfile"); cert != "" || key != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("ssl_certfile/ssl_keyfile: %v", err)
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return []redis.DialOption{redis.DialTLSConfig(config)}, nil
}
