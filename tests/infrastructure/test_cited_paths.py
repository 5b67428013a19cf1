"""Every path under tests/ or hooked/ that the repository cites exists: the README, the docs, the docstrings and
comments of hooked/, scripts/, benchmarks/ and the tests themselves, the notebooks and the build files. A file that
moves or is renamed must take its citations with it, or a reader is sent looking for a file that is not there.
(Under hooked/ a citation is a module, `hooked/interventions/sweeps.py`, or a folder, `hooked/models/`:
`hooked/ioi-gpt2` is a bundled model's name, not a path.)"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITING = [
    "README.md",
    "Makefile",
    "mkdocs.yml",
    "pyproject.toml",
    "docs/**/*.md",
    "docs/**/*.py",
    "hooked/**/*.py",
    "scripts/**/*.py",
    "benchmarks/**/*.py",
    "notebooks/*.ipynb",
    "tests/**/*.py",
]
# A path under tests/ as prose, comments and commands write it; not inside another path or a URL.
CITED = re.compile(r"(?<![\w/.-])tests/[\w/.<>-]*[\w>]|(?<![\w/.-])hooked/(?:[\w/<>]*\.py|(?:[\w]+/)+)(?![\w-])")
# TransformerLens' own test folders (tests/unit/, tests/integration/, tests/acceptance/ there): docs/transformer-lens.md
# and the ported tests name the upstream files the ports come from, which are not this repository's.
UPSTREAM_FOLDERS = ("unit", "integration", "acceptance")


def upstream(cited: str) -> bool:
    return cited.startswith("tests/") and cited.split("/")[1] in UPSTREAM_FOLDERS


def citations() -> dict[str, list[str]]:
    """Each citing file (relative to the repository) -> the tests/ paths it cites, upstream ones left out."""
    found = {}
    for pattern in CITING:
        for path in sorted(ROOT.glob(pattern)):
            text = path.read_text(encoding="utf-8")
            cited = [c for c in CITED.findall(text) if not upstream(c)]
            if cited:
                found[str(path.relative_to(ROOT))] = cited
    return found


def exists(cited: str) -> bool:
    """A file or folder; a template (`tests/families/test_<family>_parity.py`) stands for the files it matches."""
    return any(ROOT.glob(re.sub(r"<\w+>", "*", cited))) if "<" in cited else (ROOT / cited).exists()


def test_every_cited_path_exists():
    found = citations()
    assert len(found) > 40  # the docs, hooked/ and the tests cite tests; finding none means the search broke
    missing = [f"{path}: {cited}" for path, cited_paths in found.items() for cited in cited_paths if not exists(cited)]
    assert not missing, "cited but not in the repository:\n" + "\n".join(missing)


def test_the_upstream_folders_left_out_are_not_this_repositorys():
    """Upstream citations are left out because no such folder exists here; if one ever did, the exclusion would
    hide citations of this repository's files, and this fails first."""
    assert not [folder for folder in UPSTREAM_FOLDERS if (ROOT / "tests" / folder).exists()]
