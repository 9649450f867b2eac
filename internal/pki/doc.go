// Package pki makes and loads the credentials that authenticate Larder's
// components to one another: a private certificate authority, the
// cache-nodes' server certificates and the clients' certificates (mutual
// TLS on the cache-node protocol), and the NATS nkeys of each role.
//
// Production deployments bring their own CA and keys; the local stack and
// the tests generate them with this package. Private keys are written with
// mode 0600.
package pki
