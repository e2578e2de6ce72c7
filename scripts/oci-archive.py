#!/usr/bin/env python3
"""Writes a one-layer container image as an archive that `ctr images import`, `docker load` and
`podman load` all read, without a registry, a daemon or root: an OCI image layout (oci-layout,
index.json, blobs/sha256/...) with Docker's manifest.json beside it.

    oci-archive.py --out IMAGE.tar --name REPO:TAG [--file SRC:DEST[:MODE]]... [--dir DEST[:MODE]]...
        [--symlink DEST:TARGET]... [--text /DEST=CONTENT]... [--user U] [--entrypoint JSON]
        [--cmd JSON] [--expose PORT]... [--label K=V]... [--env K=V]... [--workdir DIR]

Every entry is owned by root, dated at SOURCE_DATE_EPOCH (default 0) and written in name order,
so the same inputs give the same image digest. Prints the image's config digest.
"""

import argparse
import hashlib
import io
import json
import os
import sys
import tarfile

EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))


def fail(message):
    print(f"oci-archive.py: {message}", file=sys.stderr)
    sys.exit(1)


def split(spec, what, parts):
    fields = spec.split(":", parts - 1)
    if len(fields) < parts - 1:
        fail(f"--{what} {spec!r}: expected {':'.join(['X'] * (parts - 1))}[:MODE]")
    return fields


def mode_of(text, default):
    try:
        return int(text, 8) if text else default
    except ValueError:
        fail(f"{text!r} is not an octal mode")


def layer(args):
    """The layer's tar bytes."""
    entries = {}

    def parents(dest):
        parts = dest.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            path = "/".join(parts[:i])
            entries.setdefault(path, ("dir", None, 0o755))

    for spec in args.dir:
        dest, mode = (spec.split(":", 1) + [""])[:2]
        parents(dest + "/x")
        entries[dest.strip("/")] = ("dir", None, mode_of(mode, 0o755))
    for spec in args.file:
        src, dest, *mode = spec.split(":", 2)
        if not dest:
            fail(f"--file {spec!r}: expected SRC:DEST[:MODE]")
        try:
            with open(src, "rb") as f:
                data = f.read()
            default = os.stat(src).st_mode & 0o777
        except OSError as e:
            fail(f"--file {spec!r}: {e}")
        parents(dest)
        entries[dest.strip("/")] = ("file", data, mode_of(mode[0] if mode else "", default))
    for spec in args.text:
        dest, _, content = spec.partition("=")
        if not dest.startswith("/"):
            fail(f"--text {spec!r}: expected /DEST=CONTENT")
        parents(dest)
        entries[dest.strip("/")] = ("file", content.encode(), 0o644)
    for spec in args.symlink:
        dest, target = split(spec, "symlink", 2)
        parents(dest)
        entries[dest.strip("/")] = ("symlink", target, 0o777)

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(entries):
            kind, data, mode = entries[path]
            info = tarfile.TarInfo(path)
            info.mtime = EPOCH
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = mode
            if kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif kind == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--name", required=True, help="REPOSITORY:TAG")
    for flag in ("file", "dir", "symlink", "text", "expose", "label", "env"):
        p.add_argument(f"--{flag}", action="append", default=[])
    p.add_argument("--user", default="")
    p.add_argument("--entrypoint", default=None, help="a JSON list")
    p.add_argument("--cmd", default=None, help="a JSON list")
    p.add_argument("--workdir", default="")
    args = p.parse_args()

    repository, _, tag = args.name.rpartition(":")
    if not repository or "/" in tag or not tag:
        fail(f"--name {args.name!r}: expected REPOSITORY:TAG")

    tar = layer(args)
    layer_digest = "sha256:" + hashlib.sha256(tar).hexdigest()
    config = {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}
    config["Env"] += args.env
    if args.user:
        config["User"] = args.user
    for key, flag in (("Entrypoint", args.entrypoint), ("Cmd", args.cmd)):
        if flag is not None:
            value = json.loads(flag)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                fail(f"--{key.lower()} must be a JSON list of strings")
            config[key] = value
    if args.workdir:
        config["WorkingDir"] = args.workdir
    if args.expose:
        config["ExposedPorts"] = {(e if "/" in e else e + "/tcp"): {} for e in args.expose}
    if args.label:
        config["Labels"] = dict(label.split("=", 1) for label in args.label)
    image_config = {
        "architecture": {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine),
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "scripts/oci-archive.py"}],
    }
    config_bytes = json.dumps(image_config, sort_keys=True, separators=(",", ":")).encode()
    config_digest = "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": len(config_bytes),
        },
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": len(tar)}
        ],
    }
    manifest_bytes = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    manifest_digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "annotations": {
                    "io.containerd.image.name": args.name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }
        ],
    }
    blob = lambda digest: "blobs/sha256/" + digest.split(":", 1)[1]  # noqa: E731
    docker = [{"Config": blob(config_digest), "RepoTags": [args.name], "Layers": [blob(layer_digest)]}]
    files = [
        ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
        ("index.json", json.dumps(index, sort_keys=True).encode()),
        ("manifest.json", json.dumps(docker).encode()),
        (blob(config_digest), config_bytes),
        (blob(manifest_digest), manifest_bytes),
        (blob(layer_digest), tar),
    ]
    tmp = args.out + ".tmp"
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as out:
        for directory in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(directory)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, EPOCH
            out.addfile(info)
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, EPOCH
            out.addfile(info, io.BytesIO(data))
    os.replace(tmp, args.out)
    print(config_digest)


if __name__ == "__main__":
    main()
