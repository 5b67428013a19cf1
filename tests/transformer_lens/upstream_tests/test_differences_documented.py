"""Every deliberate difference a port lists in its `DIFFERENCES` is in docs/transformer-lens.md.

Each entry names its tests before the first colon ("test_a, test_b: ..."); each such test must appear in
the section "TransformerLens' own tests", and each port must name its upstream file in its docstring.
"""

import importlib
import re
from pathlib import Path

import pytest

SUITE = Path(__file__).parent
DOCS = SUITE.parents[2] / "docs" / "transformer-lens.md"
PORTS = sorted(path.stem for path in SUITE.glob("test_*.py") if path.stem != "test_differences_documented")


def section() -> str:
    text = DOCS.read_text()
    start = text.index("## TransformerLens' own tests")
    end = text.find("\n## ", start + 1)
    return text[start:] if end == -1 else text[start:end]


@pytest.mark.parametrize("port", PORTS)
def test_port_names_its_upstream_file_and_documents_its_differences(port):
    module = importlib.import_module(f"tests.transformer_lens.upstream_tests.{port}")
    assert re.match(r"TransformerLens tests/[\w/]+\.py, ported\.", module.__doc__), module.__doc__[:80]
    upstream = module.__doc__.split(",")[0].removeprefix("TransformerLens ")
    documented = section()
    assert f"`{upstream}`" in documented, f"{upstream} is not in the docs' table of ported files"
    for difference in module.DIFFERENCES:
        head = difference.split(":")[0]
        for test_name in re.findall(r"test_\w+", head):
            assert test_name in documented, f"{port}: {test_name} is not in docs/transformer-lens.md"
