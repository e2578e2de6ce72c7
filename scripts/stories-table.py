#!/usr/bin/env python3
"""Turns the user stories' records (JSON lines, tests/stories.rs) into a Markdown table.

    python3 scripts/stories-table.py target/control-plane/stories.jsonl > docs/user-stories.md
"""
import json
import sys


def main(path):
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip()]
    rows.sort(key=lambda r: int(r["story"].split(".", 1)[0]))
    servers = sorted({r["server"] for r in rows})
    print("# The user stories, measured")
    print()
    print("Written by `scripts/real-tier.sh` (`scripts/stories-table.py` over what `tests/stories.rs`")
    print("recorded) on " + ", ".join(servers) + ". Rollouts are counted from the revisions the")
    print("cluster keeps (a Deployment's `deployment.kubernetes.io/revision`, the ControllerRevisions")
    print("of a StatefulSet or DaemonSet), confighash's writes from the API server's audit log.")
    print()
    print("| story | expected | measured | test |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['story']} | {r['expected']} | {r['measured']} | `{r['test']}` |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: stories-table.py STORIES.jsonl")
    main(sys.argv[1])
