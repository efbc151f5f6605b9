"""`duplex render -f FILE`: print every child object the operator would create, as a YAML stream."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from duplex.api.meta import KIND
from duplex.config_warnings import config_warnings
from duplex.render import InvalidSpec, desired_children, parse
from duplex.yamlio import dump_all, load_all


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="duplex render",
        description="Print, as a YAML stream, the objects the operator creates for each DisaggregatedServing in FILE. "
        "Owner references are added by the operator at apply time. Not printed: the engine key Secret "
        "(NAME-engine-key), which the operator creates once with a random key.",
    )
    parser.add_argument("-f", "--filename", required=True, help="YAML file (several documents allowed), or - for stdin")
    parser.add_argument("-n", "--namespace", default="default", help="namespace for objects that name none")
    args = parser.parse_args(argv)
    try:
        text = sys.stdin.read() if args.filename == "-" else Path(args.filename).read_text()
        docs = load_all(text)
    except (OSError, yaml.YAMLError) as e:
        print(f"duplex render: cannot read {args.filename}: {e}", file=sys.stderr)
        return 1
    servings = [d for d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if not servings:
        print(f"duplex render: {args.filename} holds no {KIND}", file=sys.stderr)
        return 1
    out, failed = [], False
    for doc in servings:
        name = (doc.get("metadata") or {}).get("name", "<unnamed>")
        try:
            serving = parse(doc, args.namespace)
            out += desired_children(serving)
            for warning in config_warnings(serving.spec):  # what the operator reports as ConfigValid ValidWithWarnings
                print(f'{KIND} "{name}": warning: {warning}', file=sys.stderr)
        except InvalidSpec as e:
            failed = True
            for err in e.errors:
                print(f'{KIND} "{name}" is invalid: {err}', file=sys.stderr)
    if failed:
        return 1
    print(dump_all(out), end="")
    return 0
