"""The README is a front page: its commands come first and every link in it resolves.

The docs site checks its own links (`mkdocs build --strict`, run by CI); the README lies
outside the site, so its links into docs/ and the repository are checked here.
"""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")

# [text](target), skipping images' alt text the same way; targets without a scheme only.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*```")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def slug(heading: str) -> str:
    """A heading's anchor, as GitHub and MkDocs' toc both make it for plain headings."""
    text = re.sub(r"`|\*|_(?=\w)|(?<=\w)_", "", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return re.sub(r"[\s-]+", "-", text)


def anchors(markdown: str) -> set:
    found, in_fence = set(), False
    for line in markdown.split("\n"):
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (m := HEADING.match(line)):
            found.add(slug(m.group(1)))
    return found


def local_links(markdown: str):
    for target in LINK.findall(markdown):
        if not re.match(r"[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto:
            yield target


def test_readme_starts_with_the_two_commands_that_work_on_a_fresh_clone():
    lines = read(README).split("\n")
    first_block = lines[lines.index("```bash") + 1:][:2]
    assert lines.index("```bash") < 4, "the commands must come first"
    assert first_block == [
        'pip install -e ".[all]" && python main.py          # install, run the main experiment',
        'pip install -e ".[all]" && python -m pytest        # install, run the tests',
    ]


def test_readme_is_a_front_page_of_at_most_250_lines():
    assert len(read(README).split("\n")) <= 250


def test_every_local_link_in_the_readme_resolves_to_a_file_and_anchor():
    readme = read(README)
    broken = []
    for target in local_links(readme):
        path, _, anchor = target.partition("#")
        full = os.path.join(ROOT, path) if path else README
        if not os.path.exists(full):
            broken.append(f"{target}: no file {path}")
        elif anchor and full.endswith(".md") and anchor not in anchors(read(full)):
            broken.append(f"{target}: no heading #{anchor} in {path or 'README.md'}")
    assert not broken, "broken links in README.md:\n" + "\n".join(broken)


def test_slug_matches_the_anchor_rules_for_code_and_punctuation():
    assert slug("The experiments of `main.py`") == "the-experiments-of-mainpy"
    assert slug("Move accuracy, judged by a solver") == "move-accuracy-judged-by-a-solver"
    assert slug("The first notebook") == "the-first-notebook"
