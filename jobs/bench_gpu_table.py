"""The side-by-side table of jobs/bench_gpu.sh from its rows.jsonl.

    bench_gpu_table.py ROWS_JSONL TABLE_CSV MODEL_LINE MAX_LEN PEAK_TFLOPS PARAMETERS STEPS

Prints the table (one line per row, vqa-hpc then PyTorch per batch), the
ratios of vqa-hpc bf16 (eager and graph) to PyTorch eager and to the best
torch.compile mode, and of vqa-hpc with its weight copies to without, and
writes TABLE_CSV. Run from the repository root
(model_flops.py is beside it).
"""
import csv, json, os, re, sys
rows_path, csv_path, model_line, max_len, peak, parameters, steps = sys.argv[1:8]
rows = [json.loads(line) for line in open(rows_path) if line.strip()]
# Per batch: vqa-hpc by precision (eager, graph, without copies, crop), then
# PyTorch eager, then the compile modes.
order = {"vqa-hpc": 0, "vqa-hpc-graph": 1, "vqa-hpc-no-copies": 2, "vqa-hpc-crop": 3,
         "pytorch-eager": 4}
rows.sort(key=lambda r: (r["batch"], order.get(r["impl"], 5), r["impl"],
                         ["bf16", "fp16", "fp32"].index(r["precision"])))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model_flops import forward_flops, model_sizes  # the GPU check's formula too

# Forward FLOPs per sample for MAX_LEN question tokens, x3 for a trained one.
train_flops = 3 * forward_flops(model_sizes(model_line), max_len)

def fmt(value, spec):
    return "n/a" if value is None else format(value, spec)

def kernels(row):
    k, graphs = row.get("kernels_per_step"), row.get("graph_launches_per_step")
    if k is None:
        return "n/a"
    return f"{k:.0f}/{graphs:.0f} graphs" if graphs else f"{k:.0f}"

columns = ["impl", "precision", "batch", "samples/s", "MFU_%", "peak_GiB", "data_%", "ops/step",
           "kernels/step", "host_ms", "gpu_idle_ms", "warmup_s"]
line = "%-34s %-9s %5s %10s %8s %8s %7s %9s %15s %8s %11s %8s"
print(line % tuple(columns))
csv_columns = ["impl", "precision", "batch", "samples_per_second", "samples_per_second_mean",
               "mfu_percent", "peak_memory_bytes", "data_wait_percent", "operators_per_step",
               "kernels_per_step",
               "graph_launches_per_step", "host_ms", "host_cpu_ms", "gpu_idle_ms",
               "warmup_seconds", "steps", "note"]
with open(csv_path, "w", newline="") as out:
    writer = csv.DictWriter(out, fieldnames=csv_columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        rate = row.get("samples_per_second")
        row["mfu_percent"] = None if rate is None else 100 * train_flops * rate / (float(peak) * 1e12)
        writer.writerow(row)
        if rate is None:
            print("%-34s %-9s %5d   %s" % (row["impl"], row["precision"], row["batch"], row["note"]))
            continue
        memory = row.get("peak_memory_bytes")
        print(line % (row["impl"], row["precision"], row["batch"], f"{rate:.2f}",
                      f"{row['mfu_percent']:.3g}", fmt(memory and memory / 2**30, ".2f"),
                      fmt(row.get("data_wait_percent"), ".1f"),
                      fmt(row.get("operators_per_step"), ".0f"), kernels(row),
                      fmt(row.get("host_ms"), ".2f"), fmt(row.get("gpu_idle_ms"), ".2f"),
                      fmt(row.get("warmup_seconds"), ".1f")))

print()
for batch in sorted({row["batch"] for row in rows}):
    done = {r["impl"] + "/" + r["precision"]: r["samples_per_second"] for r in rows
            if r["batch"] == batch and r.get("samples_per_second")}
    eager = next((v for k, v in done.items() if k.startswith("pytorch-eager/")), None)
    compiled = {k.split("/")[0][len("pytorch-compile-"):]: v for k, v in done.items()
                if k.startswith("pytorch-compile-")}
    for impl in ("vqa-hpc", "vqa-hpc-graph"):
        ours = done.get(impl + "/bf16")
        if impl == "vqa-hpc-graph" and not ours:
            continue
        parts = [f"batch {batch}: {impl} bf16 / PyTorch eager = "
                 + (f"{ours / eager:.2f}" if ours and eager else "n/a")]
        if compiled:
            mode = max(compiled, key=compiled.get)
            parts.append(f"/ best torch.compile ({mode}) = "
                         + (f"{ours / compiled[mode]:.2f}" if ours else "n/a"))
        else:
            parts.append("/ torch.compile: no row ran")
        print("; ".join(parts))
    for precision in ("bf16", "fp16"):
        with_copies = done.get("vqa-hpc/" + precision)
        without = done.get("vqa-hpc-no-copies/" + precision)
        if with_copies and without:
            print(f"batch {batch}: {precision} with weight copies / without = "
                  f"{with_copies / without:.2f}")
    crop = next((r for r in rows if r["batch"] == batch and r["impl"] == "vqa-hpc-crop"
                 and r.get("data_wait_percent") is not None), None)
    if crop:
        print(f"batch {batch}: with --augment resized-crop the data wait is "
              f"{crop['data_wait_percent']:.1f}% of the step ({crop['samples_per_second']:.1f} "
              f"samples/s)")
for row in rows:
    if row.get("steps") is not None and row["steps"] < int(steps):
        print(f"{row['impl']} {row['precision']} batch {row['batch']}: {row['steps']} timed "
              f"steps, not {steps} (the dataset has fewer questions)")
print(f"model FLOPs per trained sample: {train_flops / 1e9:.4g} G (forward x3, {max_len} question "
      f"tokens); {parameters} parameters in both models")
