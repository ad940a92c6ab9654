#!/usr/bin/env bash
# Regenerates the mutual-TLS test certificates (valid for 100 years): a CA, a receiver
# certificate for 127.0.0.1 and a client certificate Herald presents, plus a client
# certificate of another CA that the receiver must refuse. Keys are test fixtures only.
set -euo pipefail
cd "$(dirname "$0")"
days=36500
ec() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
ca() { # name
	ec "$1.key"
	openssl req -x509 -new -key "$1.key" -subj "/CN=herald test $1" -days "$days" \
		-addext basicConstraints=critical,CA:true -addext keyUsage=critical,keyCertSign -out "$1.pem"
}
leaf() { # name ca ext
	ec "$1.key"
	openssl req -new -key "$1.key" -subj "/CN=$1" -out "$1.csr"
	printf '%s\n' "$3" > "$1.ext"
	openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days "$days" \
		-extfile "$1.ext" -out "$1.pem" 2>/dev/null
	rm -f "$1.csr" "$1.ext"
}
ca ca
ca other-ca
leaf receiver ca "subjectAltName=IP:127.0.0.1
extendedKeyUsage=serverAuth"
leaf client ca "extendedKeyUsage=clientAuth"
leaf stranger other-ca "extendedKeyUsage=clientAuth"
rm -f ./*.srl ca.key other-ca.key
