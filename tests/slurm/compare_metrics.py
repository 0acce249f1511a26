#!/usr/bin/env python3
"""Compares two metrics.jsonl files (one JSON object per epoch) field by field.

    compare_metrics.py EXPECTED ACTUAL
    compare_metrics.py --keys train_loss,test_loss --tolerance 1e-5 EXPECTED ACTUAL

Fields measured with a clock differ from run to run and are left out: any
key containing "second" or "time", the bandwidths ("gbps"), the per-step
"phases", the "per_rank" timings, and what is derived from them ("slowest_rank",
"slowest_rank_excess", "diagnosis", "projection"). Every other field must be exactly equal
(tolerance 0: on CPU a resumed or relaunched run repeats the same arithmetic
in the same order), and the training results (REQUIRED) must be among them,
so that the comparison cannot pass on an empty set. Prints the compared keys
and each difference; exits 1 on any.

With --keys, only those fields are compared (each must be in every epoch of
both files), numbers within --tolerance of each other relative to the
expected value (|a - e| <= tol * max(|e|, 1e-12)): for runs whose arithmetic
differs in rounding only, such as 1 rank accumulating two micro-batches
against 2 ranks averaging them. Prints the largest relative difference.
"""
import argparse
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


def compare_keys_with_tolerance(expected, actual, keys, tolerance):
    problems = []
    worst = (0.0, None)
    for e, a in zip(expected, actual):
        for key in keys:
            if key not in e or key not in a:
                problems.append(f"epoch {e.get('epoch')}: no {key}")
                continue
            difference = abs(a[key] - e[key]) / max(abs(e[key]), 1e-12)
            if difference > worst[0] or worst[1] is None:
                worst = (difference, f"epoch {e.get('epoch')} {key}: {e[key]!r} expected, {a[key]!r} found")
            if difference > tolerance:
                problems.append(f"epoch {e.get('epoch')}: {key} = {e[key]!r} expected, {a[key]!r} found "
                                f"(relative difference {difference:.3g} > {tolerance:g})")
    return problems, worst


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", help="comma-separated fields to compare (default: every non-timing one)")
    parser.add_argument("--tolerance", type=float, default=0.0, help="relative, with --keys")
    parser.add_argument("expected")
    parser.add_argument("actual")
    arguments = parser.parse_args()
    expected_path, actual_path = arguments.expected, arguments.actual
    expected, actual = load(expected_path), load(actual_path)
    if arguments.keys:
        keys = [k for k in arguments.keys.split(",") if k]
        problems, worst = compare_keys_with_tolerance(expected, actual, keys, arguments.tolerance)
        if len(expected) != len(actual):
            problems.append(f"{len(expected)} epochs in {expected_path}, {len(actual)} in {actual_path}")
        for p in problems:
            print("metrics differ:", p)
        print(f"largest relative difference {worst[0]:.3g} ({worst[1]})")
        if not problems and expected:
            print(f"metrics within {arguments.tolerance:g}: {len(expected)} epochs, keys {', '.join(keys)}")
        return 1 if problems or not expected else 0
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
