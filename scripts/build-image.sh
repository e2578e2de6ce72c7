#!/usr/bin/env bash
# Builds the confighash image without a registry or a daemon: the Dockerfile's runtime stage
# (distroless/cc-debian12:nonroot plus the release binary) from this machine's Debian 12 files,
# into an archive that `ctr images import`, `docker load` and `podman load` read.
#
#   scripts/build-image.sh [--binary target/release/confighash] [--tag 0.1.0] \
#       [--repository ghcr.io/confighash/confighash] [--out target/image/confighash.tar]
#
# The labels, user, entrypoint and exposed ports are read from the Dockerfile's last stage, so
# the two cannot drift (tests/install/image.rs holds them together). The image holds what distroless's
# cc image holds for this binary: the binary, the shared libraries it links (found with ldd,
# glibc and libgcc_s among them) and the dynamic loader, CA certificates, /etc/passwd and
# /etc/group with root, nobody (65534) and nonroot (65532), nsswitch.conf, os-release and a
# world-writable /tmp. It lacks what distroless adds beyond that: tzdata, the libraries the binary
# does not link (libstdc++, libgomp, libssl) and the packages' copyright files.
# Prints the archive's path.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
binary="$ROOT/target/release/confighash"
repository=ghcr.io/confighash/confighash
tag=""
out=""
dockerfile="$ROOT/Dockerfile"

say() { echo "build-image.sh: $*" >&2; }
fail() {
    say "$*"
    exit 1
}

while [ $# -gt 0 ]; do
    case "$1" in
    --binary | --tag | --repository | --out | --dockerfile)
        [ $# -ge 2 ] || fail "$1 needs a value"
        declare "${1#--}=$2"
        shift 2
        ;;
    *) fail "unknown argument $1 (see the comment at the top of scripts/build-image.sh)" ;;
    esac
done
[ -x "$binary" ] || fail "no executable $binary: build it with 'cargo build --release --locked --bin confighash'"
[ -f "$dockerfile" ] || fail "no Dockerfile at $dockerfile"
for tool in python3 ldd; do
    command -v "$tool" >/dev/null || fail "$tool is needed to build the image"
done
ca=/etc/ssl/certs/ca-certificates.crt
[ -s "$ca" ] || fail "no $ca: install Debian's ca-certificates"

# The runtime stage: everything after the last FROM, continuation lines joined.
stage=$(python3 - "$dockerfile" <<'EOF'
import json, re, shlex, sys
lines = open(sys.argv[1]).read().replace("\\\n", " ").splitlines()
starts = [i for i, l in enumerate(lines) if re.match(r"\s*FROM\s", l, re.I)]
if not starts:
    sys.exit("no FROM in the Dockerfile")
args, labels, expose, user, entrypoint = {}, [], [], "", None
for line in lines[starts[-1] + 1:]:
    word, _, rest = line.strip().partition(" ")
    word = word.upper()
    subst = lambda s: re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), s)
    if word == "ARG":
        name, _, value = rest.strip().partition("=")
        args[name] = value
    elif word == "LABEL":
        for item in shlex.split(rest):
            k, _, v = item.partition("=")
            labels.append(f"{k}={subst(v)}")
    elif word == "USER":
        user = rest.strip()
    elif word == "EXPOSE":
        expose += rest.split()
    elif word == "ENTRYPOINT":
        entrypoint = json.loads(rest)
print(json.dumps({"version": args.get("VERSION", ""), "labels": labels, "expose": expose,
                  "user": user, "entrypoint": entrypoint}))
EOF
) || fail "could not read the runtime stage of $dockerfile"
field() { python3 -c 'import json,sys; v=json.loads(sys.argv[1])[sys.argv[2]]; print("\n".join(v) if isinstance(v, list) and sys.argv[2] != "entrypoint" else (json.dumps(v) if isinstance(v, list) else v))' "$stage" "$1"; }
[ -n "$tag" ] || tag=$(field version)
[ -n "$tag" ] || fail "no --tag and no ARG VERSION in the Dockerfile's runtime stage"
[ -n "$out" ] || out="$ROOT/target/image/confighash-$tag.tar"
mkdir -p "$(dirname "$out")"
entry=$(field entrypoint)
# The binary goes where the ENTRYPOINT runs it.
dest=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])[0])' "$entry")

args=(--out "$out" --name "$repository:$tag" --file "$binary:$dest:0755" --user "$(field user)"
    --entrypoint "$entry" --file "$ca:/etc/ssl/certs/ca-certificates.crt:0644"
    --file "/etc/os-release:/etc/os-release:0644" --dir /tmp:1777 --dir /home/nonroot:0755
    --text "/etc/passwd=root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
"
    --text "/etc/group=root:x:0:
nobody:x:65534:
nonroot:x:65532:
"
    --text "/etc/nsswitch.conf=hosts: files dns
")
while read -r label; do [ -n "$label" ] && args+=(--label "$label"); done < <(field labels)
while read -r port; do [ -n "$port" ] && args+=(--expose "$port"); done < <(field expose)
# The shared libraries and the loader, at the paths the binary asks for them by, each a copy of
# the file its symlinks end at (as /etc/os-release is).
libs=$(ldd "$binary" 2>&1) || fail "ldd $binary: $libs"
while read -r lib; do
    [ -n "$lib" ] || continue
    args+=(--file "$(readlink -f "$lib"):$lib:0755")
done < <(awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' <<<"$libs" | sort -u)

python3 "$HERE/oci-archive.py" "${args[@]}" >/dev/null || fail "oci-archive.py failed"
say "$repository:$tag: $(du -h "$out" | cut -f1) ($out)"
echo "$out"
