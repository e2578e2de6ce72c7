#!/usr/bin/env bash
# Installs cargo-machete 0.9.2 (the check that every crate's manifest lists only dependencies its
# code uses) into a cache folder from crates.io, and prints the binary's path. cargo-shear, which
# also reads the code's imports, needs a newer rustc than the toolchain here.
#
# Safe to run from several callers at once: a file lock serialises installs, and an installed
# binary is reused without the network.
#
#   MACHETE=$(scripts/install-cargo-machete.sh) && "$MACHETE"   # checks the crates under .
set -euo pipefail

VERSION=0.9.2
TOOLS="${CONFIGHASH_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/confighash-tools}"
DEST="$TOOLS/cargo-machete-$VERSION"
BIN="$DEST/bin/cargo-machete"

installed() {
    [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -qx "$VERSION"
}

if installed; then
    echo "$BIN"
    exit 0
fi
mkdir -p "$TOOLS"
exec 9>"$TOOLS/cargo-machete.lock"
flock 9
if installed; then
    echo "$BIN"
    exit 0
fi
echo "install-cargo-machete.sh: building cargo-machete $VERSION from crates.io" >&2
if ! cargo install --locked --quiet --root "$DEST" --version "$VERSION" cargo-machete >&2; then
    echo "install-cargo-machete.sh: cannot install cargo-machete $VERSION from crates.io" >&2
    exit 1
fi
installed || { echo "install-cargo-machete.sh: the installed cargo-machete is not $VERSION" >&2; exit 1; }
echo "$BIN"
