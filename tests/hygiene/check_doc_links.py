#!/usr/bin/env python3
"""Documentation stays inside the repository: README.md and docs/**/*.md may
not name absolute paths of a machine or link to the web, and every relative
link (outside code blocks) must name a file or folder of the repository.
Prints each problem as file:line and exits 1 when there is one."""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1]).resolve()
pages = [root / "README.md"] + sorted((root / "docs").rglob("*.md"))
machine_path = re.compile(r"(^|[\s(`'\"])/(work|tmp|root|home|usr/local/src)/")
web_link = re.compile(r"https?://")
markdown_link = re.compile(r"\]\(([^)\s]+)\)")
problems = []
for page in pages:
    fenced = False
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        where = f"{page.relative_to(root)}:{number}"
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if machine_path.search(line):
            problems.append(f"{where}: names a path outside the repository: {line.strip()}")
        if web_link.search(line):
            problems.append(f"{where}: links outside the repository: {line.strip()}")
        if fenced:
            continue
        for target in markdown_link.findall(line):
            path = target.split("#", 1)[0]
            if not path:
                continue
            resolved = (page.parent / path).resolve()
            if root not in resolved.parents and resolved != root or not resolved.exists():
                problems.append(f"{where}: link target '{target}' is not a file of the repository")
for problem in problems:
    print(problem)
print(f"kvcache docs links: {len(pages)} pages, {len(problems)} problems")
sys.exit(1 if problems else 0)
