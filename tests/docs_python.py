# SPDX-License-Identifier: Apache-2.0
"""docs_python.py SOURCE_DIR BUILD_DIR: every Python snippet of README.md
and docs/*.md runs (ctest docs-python).

Each ```python block must follow (on the line before it) a mark:
  <!-- python: program -->   run with the build's package on PYTHONPATH and
                             a private shm Store in ENCACHE_STORE (exit 0);
  <!-- python: fragment -->  part of something larger: not run.
A block without a mark fails, so that no snippet is left unchecked.
"""

import glob
import os
import re
import subprocess
import sys

BLOCK = re.compile(r"(?:<!-- python: (\w+) -->\n)?```python\n(.*?)```",
                   re.S)


def main(src, build):
    env = dict(os.environ, PYTHONPATH=os.path.join(build, "python"))
    failures = ran = 0
    pages = [os.path.join(src, "README.md")] + sorted(
        glob.glob(os.path.join(src, "docs", "*.md")))
    for page in pages:
        text = open(page, encoding="utf-8").read()
        for k, m in enumerate(BLOCK.finditer(text)):
            where = f"{os.path.relpath(page, src)} python block {k + 1}"
            mark, code = m.group(1), m.group(2)
            if mark not in ("program", "fragment"):
                print(f"{where}: no <!-- python: program|fragment --> mark")
                failures += 1
                continue
            if mark == "fragment":
                continue
            name = f"docs-python-{os.getpid()}-{k}"
            env["ENCACHE_STORE"] = f"shm://{name}?size=64MiB"
            r = subprocess.run([sys.executable, "-c", code], env=env,
                               capture_output=True, text=True, timeout=300)
            subprocess.run([os.path.join(build, "encache"), "shm", "destroy",
                            name], capture_output=True)
            ran += 1
            if r.returncode != 0:
                print(f"{where}: exit {r.returncode}\n{r.stdout}{r.stderr}")
                failures += 1
    print(f"docs_python: {ran} programs run, {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
