"""The `hooked` console script: `hooked hooks MODEL` and `hooked run MODEL PROMPT`."""

import shutil
import subprocess
import sys
from pathlib import Path

import torch

from hooked.cli import main


def test_hooks_lists_every_name_with_its_shape(gpt2, gpt2_dir, capsys):
    assert main(["hooks", str(gpt2_dir), "--pos", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == gpt2.hook_names
    listed = dict(line.split(maxsplit=1) for line in lines)
    assert listed["blocks.1.attn.hook_pattern"] == "[1, 4, 5, 5]"
    assert listed["blocks.0.mlp.hook_post"] == "[1, 5, 256]"


def test_run_prints_the_model_top_tokens(gpt2, gpt2_dir, capsys):
    prompt = "When Mary and John went to the store"
    assert main(["run", str(gpt2_dir), prompt, "--top", "3"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    with torch.no_grad():
        probs = gpt2(prompt)[0, -1].softmax(-1)
    expected = probs.topk(3)
    assert [int(row[1]) for row in rows] == expected.indices.tolist()
    assert [float(row[0]) for row in rows] == [round(p, 4) for p in expected.values.tolist()]


def test_console_script_is_installed():
    script = shutil.which("hooked", path=str(Path(sys.executable).parent))
    assert script is not None, "the `hooked` console script is not installed in this environment"
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "hooks" in result.stdout


def test_hooks_fetches_config_json_alone_for_a_hub_id(gpt2_dir, monkeypatch, capsys):
    """`hooked hooks` reads config.json only, so for a hub id it must not download the weights."""
    import huggingface_hub

    asked = []

    def snapshot_download(repo_id, allow_patterns=None, **kwargs):
        asked.append(allow_patterns)
        return str(gpt2_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    assert main(["hooks", "someone/some-gpt2"]) == 0
    assert asked == [["config.json"]]
    assert "blocks.0.attn.hook_z" in capsys.readouterr().out
