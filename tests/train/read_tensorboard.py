"""An independent reader of the TensorBoard event files vqa_train writes.

    read_tensorboard.py RUN_DIR [METRICS_JSONL]

Reads every events.out.tfevents.* file of RUN_DIR record by record (the
TFRecord framing: 8-byte length, its masked CRC-32C, the data, its masked
CRC-32C; every CRC checked with the crc32c package), decodes each Event
with Python's protobuf runtime from a schema written here from TensorBoard's
own event.proto and summary.proto (field numbers, not the project's .proto),
and compares each epoch's scalars with metrics.jsonl (RUN_DIR's, or the
one given): every tag below must be there at the record's global_step,
equal to the JSON value rounded to float32 (TensorBoard stores float32:
tolerance 0 after that rounding), and no tag at a step metrics.jsonl does
not have. The last configuration text (each start writes one) must equal
config.ini line by line.
Exits 1 naming the file, the record and the value on any difference.
"""
import glob
import json
import os
import struct
import sys

import crc32c
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

# TensorBoard's field numbers (tensorboard/compat/proto/event.proto,
# summary.proto, tensor.proto, tensor_shape.proto).
SCHEMA = {
    "TensorShapeProto": [],
    "TensorProto": [("dtype", 1, "int32"), ("string_val", 8, "bytes*")],
    "PluginData": [("plugin_name", 1, "string"), ("content", 2, "bytes")],
    "SummaryMetadata": [("plugin_data", 1, ".tb.PluginData")],
    "Value": [("tag", 1, "string"), ("simple_value", 2, "float"),
              ("tensor", 8, ".tb.TensorProto"), ("metadata", 9, ".tb.SummaryMetadata")],
    "Summary": [("value", 1, ".tb.Value*")],
    "Event": [("wall_time", 1, "double"), ("step", 2, "int64"), ("file_version", 3, "string"),
              ("summary", 5, ".tb.Summary")],
}
# metrics.jsonl key (a path) -> TensorBoard tag, written from the docs of
# the run's record (docs/training.md), not from the writer's code.
TAGS = {
    ("train_loss",): "train/loss",
    ("lr",): "train/learning_rate",
    ("samples_per_second",): "train/samples_per_second",
    ("loss_scale",): "train/loss_scale",
    ("skipped_steps",): "train/skipped_steps",
    ("overall",): "eval/overall",
    ("open",): "eval/open",
    ("closed",): "eval/closed",
    ("test_loss",): "eval/loss",
    ("step_seconds", "p50"): "step/seconds_p50",
    ("slowest_rank_excess",): "step/slowest_rank_excess",
    ("bus_gbps",): "step/bus_gbps",
}


def event_class():
    file = descriptor_pb2.FileDescriptorProto(name="tb_event.proto", package="tb", syntax="proto3")
    types = {"int32": 5, "int64": 3, "float": 2, "double": 1, "string": 9, "bytes": 12}
    for name, fields in SCHEMA.items():
        message = file.message_type.add(name=name)
        for field_name, number, kind in fields:
            repeated = kind.endswith("*")
            kind = kind.rstrip("*")
            field = message.field.add(name=field_name, number=number,
                                      label=3 if repeated else 1)
            if kind.startswith("."):
                field.type, field.type_name = 11, kind
            else:
                field.type = types[kind]
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    descriptor = pool.FindMessageTypeByName("tb.Event")
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(descriptor)
    return message_factory.MessageFactory(pool).GetPrototype(descriptor)


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    data = open(path, "rb").read()
    offset, index = 0, 0
    while offset < len(data):
        if offset + 12 > len(data):
            sys.exit(f"{path}: record {index} at byte {offset}: truncated header")
        header = data[offset:offset + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
        if masked(crc32c.crc32c(header)) != length_crc:
            sys.exit(f"{path}: record {index} at byte {offset}: length CRC mismatch")
        body = data[offset + 12:offset + 12 + length]
        footer = data[offset + 12 + length:offset + 16 + length]
        if len(body) != length or len(footer) != 4:
            sys.exit(f"{path}: record {index} at byte {offset}: truncated data")
        if masked(crc32c.crc32c(body)) != struct.unpack("<I", footer)[0]:
            sys.exit(f"{path}: record {index} at byte {offset}: data CRC mismatch")
        yield index, body
        offset += 16 + length
        index += 1


def f32(value):
    return struct.unpack("<f", struct.pack("<f", value))[0]


def main():
    run = sys.argv[1]
    metrics_path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(run, "metrics.jsonl")
    Event = event_class()
    files = sorted(glob.glob(os.path.join(run, "events.out.tfevents.*")))
    if not files:
        sys.exit(f"{run}: no events.out.tfevents.* file")
    scalars, texts, last_step = {}, [], None
    for path in files:
        first_step = None
        for index, body in records(path):
            event = Event()
            event.ParseFromString(body)
            if index == 0:
                if event.file_version != "brain.Event:2":
                    sys.exit(f"{path}: record 0 is not the version record: {event}")
                continue
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "text":
                    texts.append((event.step, value.tag, value.tensor.string_val[0].decode()))
                else:
                    scalars.setdefault(event.step, {})[value.tag] = value.simple_value
            first_step = event.step if first_step is None else first_step
        if last_step is not None and first_step is not None and first_step < last_step:
            sys.exit(f"{path}: starts at step {first_step}, before the previous file's {last_step}")
        last_step = max(scalars) if scalars else last_step
    epochs = [json.loads(line) for line in open(metrics_path) if line.strip()]
    epochs = [e for e in epochs if "global_step" in e]
    if not epochs:
        sys.exit(f"{metrics_path}: no epoch records with global_step")
    if sorted(scalars) != sorted(e["global_step"] for e in epochs):
        sys.exit(f"steps differ: events {sorted(scalars)}, {metrics_path} "
                 f"{sorted(e['global_step'] for e in epochs)}")
    compared = 0
    for record in epochs:
        step = record["global_step"]
        wanted = {}
        for path, tag in TAGS.items():
            value = record
            for key in path:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                wanted[tag] = value
        for phase, numbers in record.get("phases", {}).items():
            wanted[f"step/{phase}_seconds"] = numbers["mean"]
        got = scalars[step]
        if set(got) != set(wanted):
            sys.exit(f"step {step}: tags differ: events {sorted(got)}, "
                     f"{metrics_path} {sorted(wanted)}")
        for tag, value in wanted.items():
            if got[tag] != f32(value):
                sys.exit(f"step {step}: {tag} is {got[tag]!r} in the events, {value!r} "
                         f"(float32 {f32(value)!r}) in {metrics_path}")
            compared += 1
    config = open(os.path.join(run, "config.ini")).read().splitlines()
    configs = [text for _, tag, text in texts if tag == "config"]
    if not configs:
        sys.exit(f"{run}: no config text in the events")
    # Each start writes its configuration; config.ini holds the last one's.
    lines = [line[4:] if line.startswith("    ") else line for line in configs[-1].splitlines()]
    if lines != config:
        sys.exit(f"the last config text differs from {run}/config.ini")
    print(f"{len(files)} event file(s), {len(scalars)} steps, {compared} scalars equal to "
          f"{os.path.basename(metrics_path)}, {len(configs)} config text(s); every CRC checked")


if __name__ == "__main__":
    main()
