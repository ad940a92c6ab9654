package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// secureIdentities are the NKey users of the accounts file run by --nats-secure:
// the file refers to each one's public key as $HERALD_<NAME>_NKEY.
var secureIdentities = []string{"operator", "dispatcher", "api", "admin", "producer-tenant-a", "producer-tenant-b"}

// natsSecureOptions prepares what `run --nats-secure ACCOUNTS` needs and returns the
// server options to start from: a CA, a server certificate for 127.0.0.1, a client
// certificate and an NKey seed per identity (written to DIR/nats-secure/, for the
// tests), and the options parsed from a configuration that includes the accounts file
// unchanged, with TLS required and client certificates verified.
//
// DIR/nats-secure/ holds ca.pem, server.{crt,key}, <identity>.{crt,key,nk} and, for
// refusal tests, stranger.{crt,key} (a client certificate of another CA).
//
// With jwtMode (--nats-jwt) the same accounts and permissions run in operator mode
// instead: see natsJWTOptions.
func natsSecureOptions(stateDir, dataDir, accountsFile string, jwtMode bool) (*server.Options, error) {
	accounts, err := os.ReadFile(accountsFile)
	if err != nil {
		return nil, fmt.Errorf("--nats-secure: %w", err)
	}
	out := filepath.Join(stateDir, "nats-secure")
	os.RemoveAll(out)
	if err := os.MkdirAll(out, 0o700); err != nil {
		return nil, err
	}
	ca, caKey, err := newCA("herald-testenv-nats-ca")
	if err != nil {
		return nil, err
	}
	if err := writePEM(filepath.Join(out, "ca.pem"), "CERTIFICATE", ca.Raw); err != nil {
		return nil, err
	}
	if err := issue(out, "server", ca, caKey, true); err != nil {
		return nil, err
	}
	for _, id := range secureIdentities {
		if err := issue(out, id, ca, caKey, false); err != nil {
			return nil, err
		}
		kp, err := nkeys.CreateUser()
		if err != nil {
			return nil, err
		}
		seed, err := kp.Seed()
		if err != nil {
			return nil, err
		}
		public, err := kp.PublicKey()
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(out, id+".nk"), append(seed, '\n'), 0o600); err != nil {
			return nil, err
		}
		// nats-server resolves a variable the configuration does not define from
		// the environment: this is how the accounts file gets the public keys.
		name := "HERALD_" + strings.ToUpper(strings.ReplaceAll(id, "-", "_")) + "_NKEY"
		os.Setenv(name, public)
	}
	stranger, strangerKey, err := newCA("not-the-nats-ca")
	if err != nil {
		return nil, err
	}
	if err := issue(out, "stranger", stranger, strangerKey, false); err != nil {
		return nil, err
	}

	// include paths are relative to the including file: both live in the data dir.
	confDir := filepath.Join(dataDir, "nats-conf")
	if err := os.MkdirAll(confDir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(confDir, "herald-accounts.conf"), accounts, 0o600); err != nil {
		return nil, err
	}
	main := fmt.Sprintf(`# written by testenv run --nats-secure
tls {
  cert_file: %q
  key_file: %q
  ca_file: %q
  verify: true
  timeout: 5
}
include herald-accounts.conf
`, filepath.Join(out, "server.crt"), filepath.Join(out, "server.key"), filepath.Join(out, "ca.pem"))
	confFile := filepath.Join(confDir, "nats-server.conf")
	if err := os.WriteFile(confFile, []byte(main), 0o600); err != nil {
		return nil, err
	}
	opts, err := server.ProcessConfigFile(confFile)
	if err != nil {
		return nil, fmt.Errorf("nats: %s with %s: %w", confFile, accountsFile, err)
	}
	if jwtMode {
		return natsJWTOptions(out, confDir, accountsFile, opts)
	}
	return opts, nil
}

func newCA(name string) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now().Add(-time.Hour)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now,
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

var serial int64 = 100

// issue writes DIR/<name>.crt and DIR/<name>.key (PKCS#8), signed by ca: a server
// certificate for 127.0.0.1 and localhost, or a client certificate named name.
func issue(dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, isServer bool) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial++
	now := time.Now().Add(-time.Hour)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    now,
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if isServer {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	if err := writePEM(filepath.Join(dir, name+".crt"), "CERTIFICATE", der); err != nil {
		return err
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return err
	}
	return writePEM(filepath.Join(dir, name+".key"), "PRIVATE KEY", pkcs8)
}
