#!/usr/bin/env python3
"""Compares two metrics.jsonl files (one JSON object per epoch) field by field.

    compare_metrics.py EXPECTED ACTUAL

Fields measured with a clock differ from run to run and are left out: any
key containing "second" or "time", the bandwidths ("gbps"), the per-step
"phases", the "per_rank" timings, and what is derived from them ("slowest_rank",
"slowest_rank_excess", "diagnosis", "projection"). Every other field must be exactly equal
(tolerance 0: on CPU a resumed or relaunched run repeats the same arithmetic
in the same order), and the training results (REQUIRED) must be among them,
so that the comparison cannot pass on an empty set. Prints the compared keys
and each difference; exits 1 on any.
"""
import json
import sys


TIMING_PARTS = ("second", "time", "gbps", "phases", "per_rank", "slowest_rank", "diagnosis",
                "projection")
REQUIRED = ("epoch", "train_loss", "test_loss", "overall", "open", "closed", "lr", "samples")


def is_timing(key):
    return any(part in key for part in TIMING_PARTS)


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
    compared_keys = set()
    for e, a in zip(expected, actual):
        keys = sorted(k for k in set(e) | set(a) if not is_timing(k))
        compared_keys.update(keys)
        missing = [k for k in REQUIRED if k not in e or k not in a]
        if missing:
            problems.append(f"epoch {e.get('epoch')}: no {', '.join(missing)}")
        for key in keys:
            compared += 1
            if e.get(key) != a.get(key):
                problems.append(f"epoch {e.get('epoch')}: {key} = {e.get(key)!r} expected, {a.get(key)!r} found")
    for p in problems:
        print("metrics differ:", p)
    print("compared keys:", ", ".join(sorted(compared_keys)))
    if not problems:
        print(f"metrics equal: {len(expected)} epochs, {compared} non-timing values, tolerance 0")
    return 1 if problems or not expected else 0


if __name__ == "__main__":
    sys.exit(main())
