"""MkDocs hook: serve the plots under results/ (and its folders) at results/ in the site.

main.py writes its plots to results/ at the repository root, outside docs/. Adding them
to the site's files at build time lets a guide show `results/results.png` without a copy
that would go stale, and lets `mkdocs build --strict` check those links like any other.
"""

from pathlib import Path

from mkdocs.structure.files import File

_ROOT = Path(__file__).resolve().parents[2]


def on_files(files, config):
    for image in sorted((_ROOT / "results").rglob("*.png")):  # benchmarks' figures too
        files.append(File(image.relative_to(_ROOT).as_posix(), src_dir=str(_ROOT),
                          dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files
