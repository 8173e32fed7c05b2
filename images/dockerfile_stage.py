#!/usr/bin/env python3
"""Prints the last stage of a Dockerfile as JSON, for images/build.sh to build it with umoci.

The Dockerfile stays the one definition of each image: the daemonless build takes its runtime
stage (base, files, user, ports, labels, entrypoint and command) from the same text Docker reads.
Only what that stage needs is understood: FROM scratch, ARG, COPY --from=<stage>, USER, EXPOSE,
LABEL, ENTRYPOINT and CMD (exec form); anything else is an error, not silently skipped.

Usage: dockerfile_stage.py DOCKERFILE [NAME=VALUE ...]   (build args, as docker's --build-arg)
"""

import json
import re
import shlex
import sys


def logical_lines(text):
    """Instructions with their line continuations joined; comments and blank lines dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            current += stripped[:-1] + " "
            continue
        current += stripped
        lines.append(current)
        current = ""
    if current:
        lines.append(current)
    return lines


def substitute(value, args, where):
    def replace(match):
        name = match.group(1) or match.group(2)
        if name not in args:
            sys.exit(f"{where}: ${{{name}}} is not an ARG of the last stage")
        return args[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, value)


def exec_form(rest, where):
    try:
        value = json.loads(rest)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        sys.exit(f"{where}: only the exec form [\"...\"] is supported")
    return value


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    path = sys.argv[1]
    build_args = dict(arg.split("=", 1) for arg in sys.argv[2:])
    instructions = logical_lines(open(path, encoding="utf-8").read())
    starts = [i for i, line in enumerate(instructions) if line.split()[0].upper() == "FROM"]
    if not starts:
        sys.exit(f"{path}: no FROM")
    stage = instructions[starts[-1]:]

    image = {"copies": [], "user": None, "exposed": [], "labels": {}, "entrypoint": None, "cmd": None}
    args = {}
    for line in stage:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        where = f"{path}: {keyword}"
        if keyword == "FROM":
            if rest != "scratch":
                sys.exit(f"{where}: the last stage must be FROM scratch, not {rest}")
        elif keyword == "ARG":
            name, _, default = rest.partition("=")
            args[name] = build_args.get(name, default)
        elif keyword == "COPY":
            words = shlex.split(rest)
            if len(words) != 3 or not words[0].startswith("--from="):
                sys.exit(f"{where}: only COPY --from=<stage> <file> <path> is supported")
            image["copies"].append({"source": words[1], "destination": words[2]})
        elif keyword == "USER":
            image["user"] = substitute(rest, args, where)
        elif keyword == "EXPOSE":
            image["exposed"] += [p if "/" in p else p + "/tcp" for p in rest.split()]
        elif keyword == "LABEL":
            for pair in shlex.split(rest):
                key, sep, value = pair.partition("=")
                if not sep:
                    sys.exit(f"{where}: expected key=value, got {pair!r}")
                image["labels"][key] = substitute(value, args, where)
        elif keyword == "ENTRYPOINT":
            image["entrypoint"] = exec_form(rest, where)
        elif keyword == "CMD":
            image["cmd"] = exec_form(rest, where)
        else:
            sys.exit(f"{where}: not supported in the last stage (see images/build.sh)")
    if not image["copies"] or not image["entrypoint"]:
        sys.exit(f"{path}: the last stage needs a COPY and an ENTRYPOINT")
    json.dump(image, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
