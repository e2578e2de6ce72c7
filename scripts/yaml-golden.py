#!/usr/bin/env python3
"""kubectl's reading of the YAML 1.1 corpus, the golden file `cargo test` checks `stamp` against.

    scripts/yaml-golden.py KUBECTL KUBECONFIG [--check] [--stamp CONFIGHASH]

tests/data/yaml11/cases.json holds scalar forms and the documents (contexts) each is written
into, at @FORM@. For every (context, form) this runs the pinned kubectl (scripts/install-control-plane.sh
builds it) against a control plane (it needs discovery):

- `kubectl create --dry-run=client -o json --validate=false -f -`: kubectl's parse, the value at
  the context's pointer, or that kubectl refused the document;
- `kubectl create --dry-run=server -o json --validate=strict -f -`: whether the API server takes
  it with strict field validation: `accepted`, `wrong-type` (it cannot decode the document's
  types) or `invalid` (its validation refuses a value: a range, a name's syntax).

and writes tests/data/yaml11/golden.json, or with --check fails when what it would write differs
from the committed file (the real tier runs it so).

With --stamp, it also has `confighash stamp` rewrite every workload case kubectl reads, and
kubectl read what stamp wrote: each value must read as kubectl read the original (a null in an
annotation as the empty string, as the API server stores it).
"""
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests/data/yaml11/cases.json"
GOLDEN = ROOT / "tests/data/yaml11/golden.json"


def pointer(value, path):
    for part in path.split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(value, list):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            return None
    return value


def kubectl(kubectl, kubeconfig, args, doc):
    return subprocess.run(
        [kubectl, "--kubeconfig", kubeconfig, "create", "-f", "-", "-o", "json", *args],
        input=doc.encode(),
        capture_output=True,
        timeout=60,
    )


def stamp_roundtrip(exe, kubeconfig, confighash, cases, golden):
    written, expected = [], []
    for entry in golden:
        context = cases["contexts"][entry["context"]]
        if "value" not in entry["parse"] or "kind: Deployment" not in context["doc"]:
            continue
        doc = context["doc"].replace("@FORM@", entry["form"])
        out = subprocess.run([confighash, "stamp", "--namespace", "default", "-f", "-"],
                             input=doc.encode(), capture_output=True, timeout=60)
        if out.returncode != 0:
            continue  # stamp refuses what the API server cannot decode (cargo test checks which)
        value = entry["parse"]["value"]
        if value is None and entry["context"] == "annotation":
            value = ""
        written.append(out.stdout.decode())
        expected.append((entry["context"], entry["form"], context["pointer"], value))
    read = kubectl(exe, kubeconfig, ["--dry-run=client", "--validate=false"], "---\n".join(written))
    if read.returncode != 0:
        sys.exit(f"yaml-golden.py: kubectl cannot read what stamp wrote: {read.stderr.decode()[:500]}")
    # One JSON object per document, one after another.
    text, decoder, items, at = read.stdout.decode(), json.JSONDecoder(), [], 0
    while at < len(text):
        if text[at].isspace():
            at += 1
            continue
        item, at = decoder.raw_decode(text, at)
        items.extend(item["items"] if item.get("kind") == "List" else [item])
    wrong = [f"{c} {f!r}: kubectl reads {pointer(item, p)!r} in what stamp wrote, {v!r} in the original"
             for (c, f, p, v), item in zip(expected, items) if pointer(item, p) != v]
    if len(items) != len(expected) or wrong:
        sys.exit("yaml-golden.py: " + ("\n".join(wrong) or f"{len(items)} items for {len(expected)} documents"))
    print(f"yaml-golden.py: kubectl reads the {len(expected)} workloads stamp wrote as it read them")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    exe, kubeconfig = sys.argv[1], sys.argv[2]
    check = "--check" in sys.argv[3:]
    # The server-side dry runs create in `default`, which kube-apiserver makes as it starts.
    deadline = time.monotonic() + 60
    while subprocess.run([exe, "--kubeconfig", kubeconfig, "get", "namespace", "default"],
                         capture_output=True).returncode != 0:
        if time.monotonic() > deadline:
            sys.exit("yaml-golden.py: the API server has no namespace default after 60 s")
        time.sleep(0.5)
    cases = json.loads(CASES.read_text())
    golden = []
    for name, context in cases["contexts"].items():
        for form in cases["forms"]:
            doc = context["doc"].replace("@FORM@", form)
            parsed = kubectl(exe, kubeconfig, ["--dry-run=client", "--validate=false"], doc)
            entry = {"context": name, "form": form}
            if parsed.returncode == 0:
                entry["parse"] = {"value": pointer(json.loads(parsed.stdout), context["pointer"])}
            else:
                entry["parse"] = {"refused": True}
            strict = kubectl(exe, kubeconfig, ["--dry-run=server", "--validate=strict"], doc)
            if strict.returncode == 0:
                entry["strict"] = "accepted"
            elif b" is invalid: " in strict.stderr:
                # The API server's validation of values (ranges, name syntax).
                entry["strict"] = "invalid"
            else:
                # The document's types: it cannot be decoded.
                entry["strict"] = "wrong-type"
            golden.append(entry)
    text = json.dumps(golden, indent=1, sort_keys=True) + "\n"
    if "--stamp" in sys.argv:
        stamp_roundtrip(exe, kubeconfig, sys.argv[sys.argv.index("--stamp") + 1], cases, golden)
    if check:
        if not GOLDEN.exists() or GOLDEN.read_text() != text:
            Path(str(GOLDEN) + ".new").write_text(text)
            sys.exit(
                f"yaml-golden.py: kubectl's reading differs from {GOLDEN.relative_to(ROOT)}; "
                f"the new one is in {GOLDEN.name}.new beside it"
            )
        print(f"yaml-golden.py: {len(golden)} cases read by kubectl as {GOLDEN.name} says")
    else:
        GOLDEN.write_text(text)
        print(f"yaml-golden.py: wrote {len(golden)} cases")


if __name__ == "__main__":
    main()
