package certs

import (
	"bytes"
	"context"
	"time"
)

// UploadChains are the upload signers and their bundles, as the upload
// and clone populators use them: the upload-server signer signs each upload
// pod's serving certificate; the client bundle is what an upload pod
// accepts the proxy's client certificate from, the clone bundle what a
// clone's upload pod accepts its source pod's from.
type UploadChains struct {
	ServerSigner, ClientSigner, CloneSigner *Signer
	// ServerBundle, ClientBundle and CloneBundle hold every still-valid CA
	// of each chain.
	ServerBundle, ClientBundle, CloneBundle []byte
}

// EnsureUploadChains returns the upload chains, creating what is missing
// (the three signers, their bundles, the upload proxy's client certificate) but
// rotating nothing: the certificate controller rotates. The populators call
// it, so that an upload works even before the controller's first pass.
func (s *Store) EnsureUploadChains(ctx context.Context, now time.Time) (*UploadChains, error) {
	settings := DefaultSettings()
	var u UploadChains
	var err error
	bundle := func(name string, sg *Signer) ([]byte, error) {
		b, err := s.ReadBundle(ctx, name)
		if err != nil {
			return nil, err
		}
		if bytes.Contains(b, encodeBundle(KeepInBundle(now, sg.Cert, nil))) {
			return b, nil
		}
		b, _, err = s.EnsureBundle(ctx, name, sg.Cert, now)
		return b, err
	}
	if u.ServerSigner, _, err = s.EnsureSigner(ctx, UploadServerSigner, settings.CA, now, false); err != nil {
		return nil, err
	}
	if u.ServerBundle, err = bundle(UploadServerSigner, u.ServerSigner); err != nil {
		return nil, err
	}
	if u.ClientSigner, _, err = s.EnsureSigner(ctx, UploadServerClientSigner, settings.CA, now, false); err != nil {
		return nil, err
	}
	if u.ClientBundle, err = bundle(UploadServerClientSigner, u.ClientSigner); err != nil {
		return nil, err
	}
	if u.CloneSigner, _, err = s.EnsureSigner(ctx, CloneClientSigner, settings.CA, now, false); err != nil {
		return nil, err
	}
	if u.CloneBundle, err = bundle(CloneClientSigner, u.CloneSigner); err != nil {
		return nil, err
	}
	l := leaf{secret: UploadServerClientCert, commonName: UploadServerClientName, client: true}
	if _, err := s.EnsureLeaf(ctx, l, u.ClientSigner, settings.Client, nil, map[string][]byte{ClientCertCAKey: u.ServerBundle}, now, false); err != nil {
		return nil, err
	}
	return &u, nil
}

// LeafValidity is how long a certificate signed by sg now may be valid:
// the lifetime wanted, but not past sg's own expiry.
func LeafValidity(sg *Signer, want time.Duration, now time.Time) time.Duration {
	if left := sg.Cert.NotAfter.Sub(now); left < want {
		return left
	}
	return want
}
