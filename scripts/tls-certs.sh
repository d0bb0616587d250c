#!/usr/bin/env bash
# A private CA and one node certificate signed by it, for sluiced's TLS
# (--tls-cert/--tls-key on a primary, --replica-tls-ca on its follower;
# --rls-tls-cert/--rls-tls-key for Envoy). For a test or a first
# deployment: production keys belong to your own PKI.
#
#   scripts/tls-certs.sh DIR [NAME ...]
#
# NAMEs (default: localhost 127.0.0.1) go in the certificate's
# subjectAltName: DNS names and IP addresses a peer may check it against
# (a follower checks the host of the address it follows, or
# --replica-tls-name). Writes DIR/ca.pem (give it to followers),
# DIR/cert.pem and DIR/key.pem (the node's). A lone self-signed
# certificate does not do: it is a CA, and rustls refuses a CA as a
# server's certificate (CaUsedAsEndEntity).
set -euo pipefail
dir=${1:?usage: scripts/tls-certs.sh DIR [NAME ...]}
shift
if [ $# -eq 0 ]; then names=(localhost 127.0.0.1); else names=("$@"); fi
mkdir -p "$dir"
san=""
for n in "${names[@]}"; do
    if [[ $n =~ ^[0-9.]+$ || $n == *:* ]]; then kind=IP; else kind=DNS; fi
    san+="${san:+,}$kind:$n"
done
curve=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
openssl req -x509 "${curve[@]}" -days 365 -subj "/CN=sluice test CA" \
    -keyout "$dir/ca.key" -out "$dir/ca.pem" 2>/dev/null
openssl req "${curve[@]}" -subj "/CN=${names[0]}" \
    -keyout "$dir/key.pem" -out "$dir/node.csr" 2>/dev/null
printf '%s\n' "subjectAltName=$san" "basicConstraints=critical,CA:FALSE" \
    "keyUsage=critical,digitalSignature" "extendedKeyUsage=serverAuth,clientAuth" \
    > "$dir/node.ext"
openssl x509 -req -in "$dir/node.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -days 365 -extfile "$dir/node.ext" -out "$dir/cert.pem" 2>/dev/null
rm -f "$dir/node.csr" "$dir/node.ext" "$dir/ca.srl"
chmod 600 "$dir/key.pem" "$dir/ca.key"
echo "$dir: ca.pem (for followers), cert.pem and key.pem (the node's; $san)"
