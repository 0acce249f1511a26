#!/usr/bin/env python3
"""Checks for the M3AE parity test (standard library only).

    compare_predictions.py logits REFERENCE.json PREDICTIONS.jsonl TOLERANCE
        vqa_train's logits (--predictions-logits) against the reference's:
        each question once, every row as long as the reference's, and
        max |ours - reference| / max |reference| over every logit <= TOLERANCE
        (a NaN or an infinity in either file fails).
    compare_predictions.py same A.jsonl B.jsonl TOLERANCE
        two prediction files (1 and 2 ranks) hold the same questions in the
        same order with equal fields, numbers within TOLERANCE absolute.
"""
import json
import math
import sys


def records(path):
    with open(path) as lines:
        return [json.loads(line) for line in lines if line.strip()]


def logits(reference_path, predictions_path, tolerance):
    with open(reference_path) as f:
        reference = json.load(f)
    rows = records(predictions_path)
    ours = {str(r["qid"]): r["logits"] for r in rows}
    if len(ours) != len(rows):
        sys.exit(f"FAIL: {len(rows) - len(ours)} question(s) appear more than once in ours")
    if sorted(ours) != sorted(reference):
        sys.exit(f"FAIL: question ids differ: {len(ours)} ours, {len(reference)} reference")
    # zip() below would stop at the shorter row: a truncated row must fail here.
    for q in reference:
        if len(ours[q]) != len(reference[q]):
            sys.exit(f"FAIL: qid {q}: {len(ours[q])} logits, the reference has {len(reference[q])}")
    values = [v for row in list(ours.values()) + list(reference.values()) for v in row]
    if not values or not all(math.isfinite(v) for v in values):
        sys.exit("FAIL: no logits, or a NaN or an infinity among them")
    scale = max(abs(v) for row in reference.values() for v in row)
    worst = max(abs(a - b) for q in reference for a, b in zip(ours[q], reference[q]))
    print(f"logits of {len(ours)} questions x {len(next(iter(ours.values())))} answers: max abs "
          f"difference {worst:.3g}, max |reference| {scale:.3g}, relative {worst / scale:.3g} "
          f"(tolerance {tolerance})")
    if not worst / scale <= tolerance:
        sys.exit("FAIL: logits differ from the reference beyond the tolerance")


def close(a, b, tolerance, where):
    if isinstance(a, float) or isinstance(b, float):
        if not abs(a - b) <= tolerance:  # a NaN on either side fails too
            sys.exit(f"FAIL: {where}: {a} against {b}")
    elif isinstance(a, list):
        if len(a) != len(b):
            sys.exit(f"FAIL: {where}: lengths {len(a)} and {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            close(x, y, tolerance, f"{where}[{i}]")
    elif isinstance(a, dict):
        if sorted(a) != sorted(b):
            sys.exit(f"FAIL: {where}: fields {sorted(a)} and {sorted(b)}")
        for key in a:
            close(a[key], b[key], tolerance, f"{where}.{key}")
    elif a != b:
        sys.exit(f"FAIL: {where}: {a!r} against {b!r}")


def same(a_path, b_path, tolerance):
    a, b = records(a_path), records(b_path)
    if [r["qid"] for r in a] != [r["qid"] for r in b]:
        sys.exit("FAIL: the files hold other questions or another order")
    for x, y in zip(a, b):
        close(x, y, tolerance, f"qid {x['qid']}")
    print(f"{len(a)} prediction records equal (numbers within {tolerance})")


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] not in ("logits", "same"):
        sys.exit(__doc__)
    (logits if sys.argv[1] == "logits" else same)(sys.argv[2], sys.argv[3], float(sys.argv[4]))
