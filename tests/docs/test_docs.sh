#!/usr/bin/env bash
# The docs test: the commands of README.md and docs/*.md (docs_commands.py:
# every --option checked against the programs' --help and the scripts'
# parsers, every block run in a scratch copy of the repository unless the
# page marks it with a reason), and docs/options.md equal to the programs'
# --help (make_options_md.sh).
#
#   tests/docs/test_docs.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
source_dir=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
here=$source_dir/tests/docs
work=$(mktemp -d "${TMPDIR:-/tmp}/vqa-docs-XXXXXX")
trap 'rm -rf "$work"' EXIT

status=0
bash "$here/make_options_md.sh" "$build" >"$work/options.md"
if ! diff -u "$source_dir/docs/options.md" "$work/options.md" >"$work/options.diff"; then
  echo "FAIL: docs/options.md differs from the programs' --help; write it again with"
  echo "      bash tests/docs/make_options_md.sh build > docs/options.md"
  head -n 40 "$work/options.diff"
  status=1
fi
python3 "$here/docs_commands.py" "$source_dir" "$build" "$work" || status=1
exit "$status"
