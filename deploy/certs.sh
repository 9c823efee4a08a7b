#!/usr/bin/env bash
# A private CA and server certificates for a Sonic cluster (control plane and agents), with openssl.
#
#   bash deploy/certs.sh --out DIR --name NAME [--name NAME ...] [--dns NAME ...] [--ip ADDR ...] [--force]
#
# Writes, in DIR:
#   ca.pem, ca.key       the cluster CA (EC P-256, 10 years); made once, reused when both exist
#   NAME.pem, NAME.key   for every --name: a server certificate signed by the CA (EC P-256, 365 days)
#                        and its private key (PKCS#8 PEM, mode 0600)
#
# Every server certificate is an X.509 v3 leaf (basicConstraints CA:FALSE, keyUsage digitalSignature
# and keyEncipherment, extendedKeyUsage serverAuth and clientAuth) whose subjectAltName holds
# DNS:NAME, DNS:localhost, IP:127.0.0.1 and every --dns and --ip given (the same extra names go into
# every certificate of the run). Clients that use rustls/webpki look only at the subjectAltName,
# never at the CN: give every name and address peers will dial.
#
# Idempotent: a certificate that already exists, is signed by ca.pem, matches its key and has
# exactly the requested names is kept; one that differs is an error unless --force (which makes a
# new key and certificate for the names given). The CA is never replaced: to start over, remove
# ca.pem and ca.key (every certificate it signed must then be made again).
set -euo pipefail

CA_DAYS=3650
LEAF_DAYS=365

usage() {
    cat <<'EOF'
usage: bash deploy/certs.sh --out DIR --name NAME [--name NAME ...] [--dns NAME ...] [--ip ADDR ...] [--force]

Makes a private CA (DIR/ca.pem, DIR/ca.key; reused when present) and, for every --name, a server
certificate DIR/NAME.pem and its PKCS#8 key DIR/NAME.key (mode 0600), signed by that CA.

  --out DIR     where the files go (created, mode 0700, when missing)
  --name NAME   a host name (letters, digits, '-', '.'); the certificate's file name and a DNS SAN;
                repeat for several certificates
  --dns NAME    an extra DNS subjectAltName for every certificate of this run (may be *.domain)
  --ip ADDR     an extra IP subjectAltName (IPv4 or IPv6) for every certificate of this run
  --force       make a new key and certificate for every --name even when one exists (the CA
                is kept)
  -h, --help    this text

Every certificate also names DNS:localhost and IP:127.0.0.1. Keys are EC P-256; the CA is valid
10 years, server certificates 365 days.

Without --force an existing certificate is kept when it has exactly the names asked, and is an
error otherwise. Keep ca.key off the cluster's machines: copy only ca.pem, NAME.pem and NAME.key.

Example:
  bash deploy/certs.sh --out certs --name sonic-control --dns control.example.com --ip 10.0.0.2
EOF
}

die() {
    echo "certs.sh: error: $*" >&2
    exit 1
}
bad_usage() {
    echo "certs.sh: $*" >&2
    echo "run 'bash deploy/certs.sh --help' for usage" >&2
    exit 2
}
log() { echo "certs.sh: $*" >&2; }

# One DNS label: 1 to 63 letters, digits or '-', not starting or ending with '-'.
LABEL='[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?'
# The last label must not be all digits: that would read as an IP address, which webpki refuses as
# a DNS name (give addresses with --ip).
valid_hostname() {
    [[ ${#1} -le 253 && "$1" =~ ^$LABEL(\.$LABEL)*$ && ! "${1##*.}" =~ ^[0-9]+$ ]]
}
valid_dns() {
    local name="$1"
    [[ "$name" == \*.* ]] && name="${name#\*.}"
    valid_hostname "$name"
}
valid_ipv4() {
    local IFS=. octet
    [[ "$1" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || return 1
    for octet in $1; do
        ((10#$octet <= 255)) || return 1
    done
}
valid_ipv6() {
    # Shape only; openssl parses it for real when it writes the certificate.
    [[ "$1" == *:* && "$1" =~ ^[0-9A-Fa-f:.]+$ && ${#1} -le 45 ]]
}

out=""
names=()
dns=()
ips=()
force=0
while (($#)); do
    case "$1" in
    -h | --help)
        usage
        exit 0
        ;;
    --out | --name | --dns | --ip)
        (($# >= 2)) || bad_usage "$1 needs a value"
        [[ -n "$2" ]] || bad_usage "$1 needs a non-empty value"
        case "$1" in
        --out) out="$2" ;;
        --name) names+=("$2") ;;
        --dns) dns+=("$2") ;;
        --ip) ips+=("$2") ;;
        esac
        shift 2
        ;;
    --out=* | --name=* | --dns=* | --ip=*)
        flag="${1%%=*}"
        set -- "$flag" "${1#*=}" "${@:2}"
        ;;
    --force)
        force=1
        shift
        ;;
    *) bad_usage "unknown argument '$1'" ;;
    esac
done

[[ -n "$out" ]] || bad_usage "--out DIR is required"
((${#names[@]})) || bad_usage "at least one --name NAME is required"
for n in "${names[@]}"; do
    valid_hostname "$n" || die "--name '$n' is not a valid host name (letters, digits, '-' and '.'; labels of 1-63 characters, not starting or ending with '-'; addresses go in --ip)"
    [[ "$n" != ca ]] || die "--name ca would overwrite the CA files (ca.pem, ca.key); choose another name"
done
for d in "${dns[@]}"; do
    valid_dns "$d" || die "--dns '$d' is not a valid DNS name (a host name, or *. followed by one)"
done
for a in "${ips[@]}"; do
    valid_ipv4 "$a" || valid_ipv6 "$a" || die "--ip '$a' is not an IPv4 or IPv6 address"
done

command -v openssl >/dev/null 2>&1 || die "openssl is not installed (apt-get install openssl)"

umask 077
mkdir -p "$out" || die "cannot create $out"
[[ -w "$out" ]] || die "$out is not writable"
out="$(cd "$out" && pwd)"
# One run at a time per folder: two runs must not both make a CA.
if command -v flock >/dev/null 2>&1; then
    exec 9<"$out"
    flock 9
fi
work="$(mktemp -d "$out/.certs.XXXXXX")" || die "cannot create a temporary folder in $out"
trap 'rm -rf "$work"' EXIT

CA_PEM="$out/ca.pem"
CA_KEY="$out/ca.key"

# The public key of a certificate or of a private key, as PEM, for comparisons.
cert_pubkey() { openssl x509 -in "$1" -noout -pubkey 2>/dev/null; }
key_pubkey() { openssl pkey -in "$1" -pubout 2>/dev/null; }

new_key() {
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -pkeyopt ec_param_enc:named_curve \
        -out "$1" 2>"$work/openssl.err" || die "openssl genpkey failed: $(cat "$work/openssl.err")"
    chmod 0600 "$1"
}

# --- the CA -------------------------------------------------------------------------------------
if [[ -e "$CA_PEM" || -e "$CA_KEY" ]]; then
    [[ -f "$CA_PEM" ]] || die "$CA_KEY exists but $CA_PEM does not: restore it, or remove $CA_KEY to make a new CA"
    [[ -f "$CA_KEY" ]] || die "$CA_PEM exists but $CA_KEY does not: restore it, or remove $CA_PEM to make a new CA"
    ca_pub="$(cert_pubkey "$CA_PEM")" || die "$CA_PEM is not a PEM certificate"
    key_pub="$(key_pubkey "$CA_KEY")" || die "$CA_KEY is not a PEM private key"
    [[ "$ca_pub" == "$key_pub" ]] || die "$CA_KEY does not belong to $CA_PEM"
    openssl x509 -in "$CA_PEM" -noout -ext basicConstraints 2>/dev/null | grep -q 'CA:TRUE' ||
        die "$CA_PEM is not a CA certificate (no basicConstraints CA:TRUE)"
    openssl x509 -in "$CA_PEM" -noout -checkend 0 >/dev/null 2>&1 ||
        die "$CA_PEM has expired: remove ca.pem and ca.key and make every certificate again"
    log "reusing the CA $CA_PEM ($(openssl x509 -in "$CA_PEM" -noout -subject -nameopt oneline 2>/dev/null | sed 's/^subject= *//'))"
else
    cat >"$work/ca.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
[dn]
[v3_ca]
basicConstraints = critical, CA:TRUE, pathlen:0
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
EOF
    new_key "$work/ca.key"
    # A random suffix, so that the CAs of two clusters never share a subject name.
    openssl req -new -x509 -config "$work/ca.cnf" -extensions v3_ca -key "$work/ca.key" \
        -subj "/O=Sonic/CN=Sonic cluster CA $(openssl rand -hex 4)" \
        -days "$CA_DAYS" -sha256 -set_serial "0x$(openssl rand -hex 16)" \
        -out "$work/ca.pem" 2>"$work/openssl.err" || die "openssl req (CA) failed: $(cat "$work/openssl.err")"
    chmod 0644 "$work/ca.pem"
    mv "$work/ca.key" "$CA_KEY"
    mv "$work/ca.pem" "$CA_PEM"
    log "made the CA $CA_PEM (key $CA_KEY, mode 0600: keep it off the cluster's machines if you can)"
fi

# --- server certificates ------------------------------------------------------------------------
# The subjectAltName entries wanted for NAME, one per line, as openssl prints them ("DNS:x", "IP
# Address:1.2.3.4"), sorted and without duplicates.
wanted_sans() {
    {
        printf 'DNS:%s\n' "$1" localhost "${dns[@]}"
        printf 'IP:%s\n' 127.0.0.1 "${ips[@]}"
    } | awk '!seen[tolower($0)]++'
}
# The same in openssl's printed form, for comparing with an existing certificate. IPv6 addresses
# are compared after openssl's own formatting (it prints them expanded), so take them from a
# certificate made with the wanted names.
san_list() {
    openssl x509 -in "$1" -noout -ext subjectAltName 2>/dev/null |
        tail -n +2 | tr ',' '\n' | sed 's/^ *//; s/ *$//' | sed '/^$/d' | tr '[:upper:]' '[:lower:]' | sort -u
}

make_leaf() { # NAME KEY PEM
    local name="$1" key="$2" pem="$3" sans
    sans="$(wanted_sans "$name" | paste -sd, -)"
    cat >"$work/leaf.cnf" <<EOF
[req]
distinguished_name = dn
prompt = no
[dn]
[v3_leaf]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth, clientAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
subjectAltName = $sans
EOF
    openssl req -new -config "$work/leaf.cnf" -key "$key" -subj "/O=Sonic/CN=$name" \
        -out "$work/leaf.csr" 2>"$work/openssl.err" || die "openssl req ($name) failed: $(cat "$work/openssl.err")"
    openssl x509 -req -in "$work/leaf.csr" -CA "$CA_PEM" -CAkey "$CA_KEY" \
        -set_serial "0x$(openssl rand -hex 16)" -days "$LEAF_DAYS" -sha256 \
        -extfile "$work/leaf.cnf" -extensions v3_leaf -out "$pem" 2>"$work/openssl.err" ||
        die "openssl x509 -req ($name) failed (check --dns/--ip values): $(cat "$work/openssl.err")"
    chmod 0644 "$pem"
}

made=0
kept=0
for name in "${names[@]}"; do
    pem="$out/$name.pem"
    key="$out/$name.key"
    if [[ -e "$pem" || -e "$key" ]] && ((!force)); then
        # Keep it when it is exactly what is asked; otherwise say what differs.
        [[ -f "$pem" ]] || die "$key exists but $pem does not: remove $key, or pass --force to make a new key and certificate"
        [[ -f "$key" ]] || die "$pem exists but $key does not: remove $pem, or pass --force to make a new key and certificate"
        [[ "$(cert_pubkey "$pem")" == "$(key_pubkey "$key")" && -n "$(key_pubkey "$key")" ]] ||
            die "$key does not belong to $pem; pass --force to replace both"
        openssl verify -CAfile "$CA_PEM" "$pem" >/dev/null 2>&1 ||
            die "$pem is not signed by $CA_PEM (or has expired); pass --force to replace it"
        # What the wanted names look like once openssl has written them: a throwaway certificate.
        new_key "$work/probe.key"
        make_leaf "$name" "$work/probe.key" "$work/probe.pem"
        have="$(san_list "$pem")"
        want="$(san_list "$work/probe.pem")"
        if [[ "$have" != "$want" ]]; then
            die "$pem exists with other subjectAltNames (has: $(paste -sd' ' <<<"$have"); asked: $(paste -sd' ' <<<"$want")); pass --force to replace it"
        fi
        openssl x509 -in "$pem" -noout -checkend $((30 * 86400)) >/dev/null 2>&1 ||
            log "warning: $pem expires within 30 days ($(openssl x509 -in "$pem" -noout -enddate)); renew with --force"
        log "keeping $pem (same names, signed by this CA)"
        kept=$((kept + 1))
        continue
    fi
    new_key "$work/$name.key"
    make_leaf "$name" "$work/$name.key" "$work/$name.pem"
    openssl verify -CAfile "$CA_PEM" "$work/$name.pem" >/dev/null 2>"$work/openssl.err" ||
        die "the new certificate for $name does not verify: $(cat "$work/openssl.err")"
    mv -f "$work/$name.key" "$key"
    mv -f "$work/$name.pem" "$pem"
    log "made $pem and $key: $(wanted_sans "$name" | paste -sd' ' -)"
    made=$((made + 1))
done
log "done in $out: $made made, $kept kept"
