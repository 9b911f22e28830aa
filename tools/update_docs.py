"""Render the figures the README quotes from the committed results (``labkit.measured``), so none is typed in.

    python tools/update_docs.py           # rewrite the README's measured block
    python tools/update_docs.py --check   # exit 1 if it differs (the tests do this)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from labkit import measured  # noqa: E402


def render(readme: str) -> str:
    start, end = readme.index(measured.README_BEGIN), readme.index(measured.README_END) + len(measured.README_END)
    return readme[:start] + measured.readme_block() + readme[end:]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the README is up to date")
    args = parser.parse_args(argv)
    path = REPO / "README.md"
    text = path.read_text()
    new = render(text)
    if args.check:
        if new != text:
            print("README.md's measured block differs from the committed results: run python tools/update_docs.py")
            return 1
        return 0
    path.write_text(new)
    print("README.md: measured block rendered from", measured.latest().where if measured.latest() else "nothing")
    return 0


if __name__ == "__main__":
    sys.exit(main())
