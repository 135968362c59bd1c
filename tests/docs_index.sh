#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# docs_index.sh SOURCE_DIR: the README's documentation index matches docs/
# (ctest docs-index): every page of docs/ is linked from README.md, and
# every file README.md links to exists.
set -eu
cd "$1"
rc=0
for f in docs/*.md; do
  grep -qF "]($f)" README.md || {
    echo "README.md: the documentation index does not link to $f" >&2
    rc=1
  }
done
for f in $(grep -oE '\]\([^)#:]+' README.md | cut -c3-); do
  [ -e "$f" ] || {
    echo "README.md: links to $f, which does not exist" >&2
    rc=1
  }
done
exit $rc
