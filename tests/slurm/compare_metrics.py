#!/usr/bin/env python3
"""Compares two metrics.jsonl files (one JSON object per epoch) field by field.

    compare_metrics.py EXPECTED ACTUAL

Timing fields (any key with "second" or "time" in its name, and the "phases"
breakdown) differ from run to run and are left out; every other field must be
exactly equal (tolerance 0: on CPU a resumed or relaunched run repeats the
same arithmetic in the same order). Prints each difference; exits 1 on any.
"""
import json
import sys


def is_timing(key):
    return "second" in key or "time" in key or key == "phases"


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    expected_path, actual_path = sys.argv[1], sys.argv[2]
    expected, actual = load(expected_path), load(actual_path)
    problems = []
    if len(expected) != len(actual):
        problems.append(f"{len(expected)} epochs in {expected_path}, {len(actual)} in {actual_path}")
    compared = 0
    for e, a in zip(expected, actual):
        keys = sorted(k for k in set(e) | set(a) if not is_timing(k))
        for key in keys:
            compared += 1
            if e.get(key) != a.get(key):
                problems.append(f"epoch {e.get('epoch')}: {key} = {e.get(key)!r} expected, {a.get(key)!r} found")
    for p in problems:
        print("metrics differ:", p)
    if not problems:
        print(f"metrics equal: {len(expected)} epochs, {compared} non-timing values, tolerance 0")
    return 1 if problems or not expected else 0


if __name__ == "__main__":
    sys.exit(main())
