package cluster

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// PKI is the cluster's certificate authority and the files it issued, all under
// Dir. One CA signs everything: API server serving cert, client certs (admin,
// scheduler, controller-manager, nodes) and CSRs via the controller-manager.
// The CA key stays on disk so that another process (a kubelet-side harness, the
// CLI's node-kubeconfig command) can mint more client certs with LoadPKI.
type PKI struct {
	Dir        string
	CACertFile string
	CAKeyFile  string
	// Service-account token signing key pair (RSA, PEM): the API server signs
	// and verifies with it, the controller-manager signs tokens with it.
	ServiceAccountKeyFile string
	ServiceAccountPubFile string
	// Front-proxy (request-header) CA: lets the API server proxy to aggregated
	// API servers, and gives the controller-manager and scheduler a complete
	// extension-apiserver-authentication ConfigMap.
	FrontProxyCACertFile string
	FrontProxyCAKeyFile  string

	caCert         *x509.Certificate
	caKey          crypto.Signer
	frontProxyCert *x509.Certificate
	frontProxyKey  crypto.Signer
}

const certValidity = 7 * 24 * time.Hour

// NewPKI creates a fresh CA, front-proxy CA and service-account key pair in dir.
func NewPKI(dir string) (*PKI, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := pkiPaths(dir)
	var err error
	if p.caCert, p.caKey, err = newCA("topodra-test-ca", p.CACertFile, p.CAKeyFile); err != nil {
		return nil, err
	}
	// The front-proxy (request-header) CA is separate, as it must be: whoever
	// holds a cert from it can assert any user to the API server.
	if p.frontProxyCert, p.frontProxyKey, err = newCA("topodra-front-proxy-ca", p.FrontProxyCACertFile, p.FrontProxyCAKeyFile); err != nil {
		return nil, err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(saKey.Public())
	if err != nil {
		return nil, err
	}
	if err := writeKey(p.ServiceAccountKeyFile, saKey); err != nil {
		return nil, err
	}
	if err := writePEM(p.ServiceAccountPubFile, "PUBLIC KEY", pubDER, 0o644); err != nil {
		return nil, err
	}
	return p, nil
}

func newCA(cn, certFile, keyFile string) (*x509.Certificate, crypto.Signer, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(certValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return cert, key, writeCertKey(certFile, keyFile, der, key)
}

// LoadPKI opens the PKI that NewPKI wrote into dir.
func LoadPKI(dir string) (*PKI, error) {
	p := pkiPaths(dir)
	certPEM, err := os.ReadFile(p.CACertFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(p.CAKeyFile)
	if err != nil {
		return nil, err
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("pki %s: bad PEM in CA files", dir)
	}
	if p.caCert, err = x509.ParseCertificate(cb.Bytes); err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, err
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("CA key is not a signer")
	}
	p.caKey = signer
	return p, nil
}

func pkiPaths(dir string) *PKI {
	return &PKI{
		Dir:                   dir,
		CACertFile:            filepath.Join(dir, "ca.crt"),
		CAKeyFile:             filepath.Join(dir, "ca.key"),
		ServiceAccountKeyFile: filepath.Join(dir, "service-account.key"),
		ServiceAccountPubFile: filepath.Join(dir, "service-account.pub"),
		FrontProxyCACertFile:  filepath.Join(dir, "front-proxy-ca.crt"),
		FrontProxyCAKeyFile:   filepath.Join(dir, "front-proxy-ca.key"),
	}
}

// CAPEM returns the CA certificate in PEM form.
func (p *PKI) CAPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.caCert.Raw})
}

// IssueServing writes <name>.crt/.key: a serving cert for the given DNS names
// and IP addresses.
func (p *PKI) IssueServing(name string, hosts []string) (certFile, keyFile string, err error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: name},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return p.issue(name, tmpl, p.caCert, p.caKey)
}

// IssueClient writes <name>.crt/.key: a client cert whose CN is the user and
// whose O entries are the groups, as the API server's x509 authenticator reads them.
func (p *PKI) IssueClient(name, user string, groups []string) (certFile, keyFile string, err error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return p.issue(name, tmpl, p.caCert, p.caKey)
}

// IssueFrontProxyClient writes <name>.crt/.key signed by the front-proxy CA.
func (p *PKI) IssueFrontProxyClient(name, cn string) (certFile, keyFile string, err error) {
	tmpl := &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return p.issue(name, tmpl, p.frontProxyCert, p.frontProxyKey)
}

func (p *PKI) issue(name string, tmpl *x509.Certificate, caCert *x509.Certificate, caKey crypto.Signer) (string, string, error) {
	if caKey == nil {
		return "", "", errors.New("pki: CA not loaded")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	now := time.Now()
	tmpl.SerialNumber = serial()
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = now.Add(certValidity)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, key.Public(), caKey)
	if err != nil {
		return "", "", err
	}
	certFile := filepath.Join(p.Dir, name+".crt")
	keyFile := filepath.Join(p.Dir, name+".key")
	return certFile, keyFile, writeCertKey(certFile, keyFile, der, key)
}

// WriteKubeconfig issues a client cert for user/groups and writes a
// self-contained kubeconfig (certs embedded) for server to path.
func (p *PKI) WriteKubeconfig(path, server, certName, user string, groups []string) error {
	certFile, keyFile, err := p.IssueClient(certName, user, groups)
	if err != nil {
		return err
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return err
	}
	const name = "topodra"
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: p.CAPEM()}
	cfg.AuthInfos[user] = &clientcmdapi.AuthInfo{ClientCertificateData: certPEM, ClientKeyData: keyPEM}
	cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: user}
	cfg.CurrentContext = name
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return clientcmd.WriteToFile(*cfg, path)
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err)
	}
	return n
}

func writeCertKey(certFile, keyFile string, der []byte, key crypto.Signer) error {
	if err := writePEM(certFile, "CERTIFICATE", der, 0o644); err != nil {
		return err
	}
	return writeKey(keyFile, key)
}

func writeKey(path string, key crypto.Signer) error {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(path, "PRIVATE KEY", der, 0o600)
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}
