#!/usr/bin/env python3
"""The commands of README.md and docs/*.md, checked and run.

    docs_commands.py SOURCE_DIR BUILD_DIR WORK_DIR

Reads every fenced ```sh / ```bash block of the pages and
  (a) checks every --option given to vqa_train, vqa_prep, the other programs
      in BUILD_DIR and the scripts of jobs/, tests/ and env/ against the
      program's --help (or the options the script's own parser accepts);
  (b) runs every block that is not marked, in a scratch copy of the
      repository (WORK_DIR/repo: links to the sources, build/ -> BUILD_DIR,
      data/ and runs/ of its own), the blocks of one page in order, each in
      its own `bash -euo pipefail`;
  (c) takes a block as not run only when the line before it says why:
        <!-- docs-test: skip (REASON) -->
        <!-- docs-test: stand-in NAME (REASON) -->  (run, after the test has
                                                     written stand-in inputs)
      a marker without a reason, or an unknown one, fails.
Also fails on a link to a file of the repository that is not there.
Prints one line per block; exits 1 on any failure, naming page and line.
"""
import os
import re
import shlex
import struct
import subprocess
import sys
import time
import zlib
import json

PROGRAMS = ["vqa_train", "vqa_prep", "vqa_project", "vqa_allreduce_bench", "vqa_loader_bench"]
PREP_COMMANDS = ["synth", "convert", "inspect", "tokenize"]
# Scripts that hand their arguments on: (program, positional arguments first).
PASSES_ON = {
    "jobs/quickstart.sh": ("vqa_train", 0),
    "jobs/slurm/train_1node.sbatch": ("vqa_train", 1),
    "jobs/slurm/train_multinode.sbatch": ("vqa_train", 1),
    "jobs/slurm/prep_data.sbatch": ("vqa_prep", 0),
    "jobs/bench_scaling.sh": ("vqa_train", 1),
    "jobs/bench_slow_link.sh": ("vqa_train", 1),
    "jobs/bench_projection.sh": ("vqa_train", 1),
    "jobs/bench_gpu.sh": ("vqa_train", 1),
}
# Blocks of one page run in this order of pages: later pages read what
# earlier ones wrote (performance.md reads the run training.md makes).
PAGE_ORDER = ["README.md", "docs/install.md", "docs/data.md", "docs/training.md"]
MARKER = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->")
BLOCK_TIMEOUT_S = 240


def pages(source):
    found = ["README.md"] + sorted("docs/" + name for name in os.listdir(os.path.join(source, "docs"))
                                   if name.endswith(".md"))
    ordered = [p for p in PAGE_ORDER if p in found] + [p for p in found if p not in PAGE_ORDER]
    return ordered


def blocks_of(source, page):
    """[(line, text, marker or None, marker error or None)] of the page's sh/bash blocks."""
    lines = open(os.path.join(source, page), encoding="utf-8").read().split("\n")
    result, fence, start, body, lang = [], None, 0, [], ""
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if fence is None:
            m = re.match(r"^(`{3,}|~{3,})\s*([\w+-]*)", stripped)
            if m:
                fence, lang, start, body = m.group(1), m.group(2).lower(), number, []
            continue
        if stripped.startswith(fence) and stripped.strip("`~") == "":
            if lang in ("sh", "bash", "shell"):
                before = [l.strip() for l in lines[:start - 1] if l.strip()]
                marker = MARKER.search(before[-1]) if before else None
                result.append((start, "\n".join(body), marker.group(1) if marker else None))
            fence = None
            continue
        body.append(line)
    return result


def parse_marker(text):
    """(kind, name, reason) or raises ValueError."""
    m = re.fullmatch(r"(skip|stand-in)\s*([\w-]*)\s*\((.+)\)", text, re.S)
    if not m:
        raise ValueError(f"docs-test marker '{text}' is neither 'skip (REASON)' nor "
                         "'stand-in NAME (REASON)'")
    kind, name, reason = m.groups()
    if kind == "skip" and name:
        raise ValueError(f"docs-test marker '{text}': skip takes only a reason in brackets")
    if kind == "stand-in" and name not in STAND_INS:
        raise ValueError(f"docs-test marker '{text}': no stand-in named '{name}' "
                         f"(known: {', '.join(sorted(STAND_INS))})")
    if not reason.strip():
        raise ValueError(f"docs-test marker '{text}' gives no reason")
    return kind, name, reason


def help_options(text):
    """The --options a --help text lists: at a line's start or as `-x [ --name ]`."""
    names = set()
    for line in text.splitlines():
        m = re.match(r"^\s+(?:-\w\s+\[\s+)?--([a-z0-9][a-z0-9-]*)", line)
        if m:
            names.add(m.group(1))
    return names


def script_options(path):
    """The --options a shell script's own `case` parser accepts."""
    names = set()
    pattern = re.compile(r"^\s*\(?((?:-{1,2}[\w-]+(?:=\*)?\s*\|\s*)*-{1,2}[\w-]+(?:=\*)?)\)")
    for line in open(path, encoding="utf-8", errors="replace"):
        m = pattern.match(line)
        if m:
            names.update(re.findall(r"--([\w-]+)", m.group(1)))
    return names


class Options:
    """Accepted options, per program (vqa_prep per command) and per script."""

    def __init__(self, source, build):
        self.source, self.build, self.cache = source, build, {}

    def of(self, context):
        if context not in self.cache:
            self.cache[context] = self._load(context)
        return self.cache[context]

    def _load(self, context):
        if context.startswith("script:"):
            return script_options(os.path.join(self.source, context[len("script:"):]))
        program, _, command = context.partition(":")
        argv = [os.path.join(self.build, program)] + ([command] if command else []) + ["--help"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        names = help_options(out.stdout + out.stderr)
        if out.returncode != 0 or not names:
            raise RuntimeError(f"{' '.join(argv)} gave exit {out.returncode} and no options:\n"
                               f"{out.stdout}{out.stderr}")
        return names | {"help"}


def program_of(token):
    base = token.rsplit("/", 1)[-1]
    return base if base in PROGRAMS else None


def script_of(token):
    m = re.search(r"(?:^|/)((?:jobs|tests|env)/[\w./-]+\.(?:sh|sbatch))$", token)
    return m.group(1) if m else None


def commands(text):
    """Token lists of the block's commands (continuations joined, comments dropped)."""
    text = text.replace("\\\n", " ")
    result = []
    for line in text.split("\n"):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError:
            tokens = line.split()
        current = []
        for token in tokens:
            if token and set(token) <= set("|&;()<>"):
                if current:
                    result.append(current)
                current = []
            else:
                current.append(token)
        if current:
            result.append(current)
    return result


def check_options(tokens, options):
    """Problems with the --options of one command's tokens."""
    problems, context, positional_left, pass_to = [], None, 0, None
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        # `prep=$` from `prep=$(sbatch ...`: an assignment's head is no command.
        program, script = program_of(token), script_of(token)
        if program:
            context = program
            if program == "vqa_prep" and i < len(tokens) and tokens[i] in PREP_COMMANDS:
                context = f"vqa_prep:{tokens[i]}"
                i += 1
            pass_to = None
            continue
        if script:
            context, pass_to = f"script:{script}", PASSES_ON.get(script)
            positional_left = pass_to[1] if pass_to else 0
            if pass_to and positional_left == 0:
                context = pass_to[0]
                if context == "vqa_prep" and i < len(tokens) and tokens[i] in PREP_COMMANDS:
                    context = f"vqa_prep:{tokens[i]}"
                    i += 1
                elif context == "vqa_prep" and i < len(tokens):
                    # prep_data.sbatch RECIPE DIR [convert options]: the recipe's convert.
                    if not os.path.isfile(os.path.join(options.source, "jobs/configs",
                                                       tokens[i] + ".ini")):
                        problems.append(f"`{tokens[i]}` is neither a vqa_prep command nor a "
                                        "recipe of jobs/configs/")
                    context = "vqa_prep:convert"
                    i += 2
            continue
        if context is None:
            continue
        if token.startswith("--") and len(token) > 2:
            name = token[2:].split("=", 1)[0]
            try:
                known = options.of(context)
            except (OSError, RuntimeError, subprocess.TimeoutExpired) as error:
                problems.append(f"cannot read the options of {context}: {error}")
                context = None
                continue
            if name not in known:
                where = context.replace("script:", "").replace(":", " ")
                problems.append(f"`--{name}` is not an option of {where}")
        elif not token.startswith("-") and context.startswith("script:") and pass_to:
            positional_left -= 1
            if positional_left == 0:
                context = pass_to[0]
    return problems


# Stand-in inputs a block may ask for (the marker names one).
def png_bytes(width, height, rgb):
    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def stand_in_vqa_rad(repo):
    """trainset.json, testset.json and images/ in VQA-RAD's layout: 6 + 3 questions, 3 images."""
    os.makedirs(os.path.join(repo, "images"), exist_ok=True)
    for name, size, rgb in (("a.png", (40, 30), (200, 10, 50)), ("b.png", (30, 50), (0, 255, 0)),
                            ("c.png", (64, 48), (0, 0, 255))):
        with open(os.path.join(repo, "images", name), "wb") as f:
            f.write(png_bytes(size[0], size[1], rgb))
    def record(qid, image, question, answer, kind):
        return {"qid": qid, "image_name": image, "question": question, "answer": answer,
                "answer_type": kind, "question_type": "PRES", "phrase_type": "freeform",
                "image_organ": "CHEST"}
    train = [record(1, "a.png", "Is there a mass?", "Yes", "CLOSED"),
             record(2, "b.png", "Is the heart enlarged?", "no", "CLOSED"),
             record(3, "c.png", "Which side is the lesion on?", "Left", "OPEN"),
             record(4, "a.png", "What modality is this?", "x-ray", "OPEN"),
             record(5, "b.png", "How many masses?", "2", "OPEN"),
             record(6, "c.png", "Is there a mass?", "yes", "CLOSED")]
    test = [record(101, "b.png", "Is there a mass?", "yes", "CLOSED"),
            record(102, "a.png", "Which side?", "right", "OPEN"),
            record(103, "c.png", "How many lesions?", "2", "OPEN")]
    json.dump(train, open(os.path.join(repo, "trainset.json"), "w"))
    json.dump(test, open(os.path.join(repo, "testset.json"), "w"))


STAND_INS = {"vqa-rad": stand_in_vqa_rad}


def make_repo(source, build, work):
    """WORK/repo: links to the sources, build -> BUILD_DIR, data/ and runs/ its own."""
    repo = os.path.join(work, "repo")
    os.makedirs(repo)
    for name in os.listdir(source):
        if name in ("build", "data", "runs", "models", ".git") or name.startswith("build"):
            continue
        os.symlink(os.path.join(source, name), os.path.join(repo, name))
    os.symlink(build, os.path.join(repo, "build"))
    for name in ("data", "runs"):
        os.makedirs(os.path.join(repo, name))
    return repo


def broken_links(source, page):
    """Links of the page to files of the repository that are not there."""
    text = open(os.path.join(source, page), encoding="utf-8").read()
    folder = os.path.dirname(os.path.join(source, page))
    problems = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        path = target.split("#", 1)[0]
        if not path or re.match(r"^[a-z]+:", path):
            continue
        if not os.path.exists(os.path.join(folder, path)):
            problems.append(f"{page}: the link to {target} leads nowhere")
    return problems


def main():
    source, build, work = (os.path.abspath(a) for a in sys.argv[1:4])
    options = Options(source, build)
    failures, run, skipped = [], 0, 0
    plan = []
    for page in pages(source):
        failures += broken_links(source, page)
        for line, text, marker in blocks_of(source, page):
            where = f"{page}:{line}"
            kind, name = "run", ""
            if marker is not None:
                try:
                    kind, name, _ = parse_marker(marker)
                except ValueError as error:
                    failures.append(f"{where}: {error}")
                    continue
            for tokens in commands(text):
                for problem in check_options(tokens, options):
                    failures.append(f"{where}: {problem} (in: {' '.join(tokens)[:120]})")
            if kind == "skip":
                skipped += 1
                print(f"skip  {where}: {marker}")
            else:
                plan.append((where, text, name))
    repo = make_repo(source, build, work)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    for where, text, stand_in in plan:
        if stand_in:
            STAND_INS[stand_in](repo)
        start = time.monotonic()
        try:
            out = subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=repo, env=env,
                                 capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
            status, output = out.returncode, out.stdout + out.stderr
        except subprocess.TimeoutExpired as error:
            status = "timeout"
            output = (error.stdout or b"").decode(errors="replace") if isinstance(error.stdout, bytes) else str(error.stdout or "")
        seconds = time.monotonic() - start
        run += 1
        print(f"run   {where}: exit {status} in {seconds:.1f} s" + (f" (stand-in {stand_in})" if stand_in else ""))
        if status != 0:
            tail = "\n".join("    " + l for l in output.strip().splitlines()[-15:])
            failures.append(f"{where}: the block failed (exit {status}):\n{tail}")
    print(f"docs: {run} blocks run, {skipped} marked skip, {len(failures)} problem(s)")
    for failure in failures:
        print(f"FAIL: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
