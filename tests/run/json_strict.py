#!/usr/bin/env python3
"""Strict JSON check for tests: `json_strict.py FILE` exits 0 when FILE is UTF-8 (strict decoding)
holding one RFC 8259 JSON value (no NaN/Infinity, no control characters in strings, no duplicate
keys), else prints why and exits 1. For a Chrome trace it prints, per "X" slice, the UTF-8 hex of
its name and of args.domain, one slice a line."""
import json
import sys


def no_constant(name):
    raise ValueError("not JSON: " + name)


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate key in object: %r" % keys)
    return dict(pairs)


def main():
    data = open(sys.argv[1], "rb").read()
    try:
        text = data.decode("utf-8", errors="strict")
        doc = json.loads(text, parse_constant=no_constant, object_pairs_hook=no_duplicates,
                         strict=True)
    except (UnicodeDecodeError, ValueError) as e:
        print("invalid: %s" % e)
        return 1
    if isinstance(doc, dict):
        for event in doc.get("traceEvents", []):
            if event.get("ph") == "X":
                # surrogatepass would hide a lone "\ud800" escape: encode strictly.
                print(event["name"].encode("utf-8").hex() or "-",
                      event["args"]["domain"].encode("utf-8").hex() or "-")
    return 0


if __name__ == "__main__":
    sys.exit(main())
