"""`make gpu-check --dry-run` (scripts/gpu_check.py): every step runs on the CPU with tiny shapes, so the
GPU command cannot rot between the rare sessions that have a GPU (issue 21)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"
STEPS = {1: "correctness", 2: "kernel-bench", 3: "end-to-end", 4: "compile", 5: "eap", 6: "vllm", 7: "dictionaries"}
SKIPPED_WHOLE = {6}  # vLLM: not in this environment (or not started by a dry run): skipped, and says why


def test_dry_run_runs_every_step_and_writes_the_report(tmp_path):
    out = tmp_path / "gpu-check"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--out", str(out)], capture_output=True, text=True, timeout=180
    )
    printed = result.stdout + result.stderr
    assert result.returncode == 0, printed[-4000:]

    for step, name in STEPS.items():  # one closing line per step, and at least one result line in it
        assert f"[{step} {name}] step: ok" in printed, printed[-4000:]
        results = [line for line in printed.splitlines() if line.startswith(f"[{step} {name}]") and "step:" not in line]
        assert results, f"step {step} printed no result line"
        assert all(": ok" in line or ": skipped" in line or ": info" in line for line in results), results

    report = json.loads((out / "gpu-check.json").read_text())
    environment = report["environment"]
    for key in ("torch", "torch_cuda", "triton", "transformers", "cuda_available"):
        assert key in environment
    assert report["dry_run"] is True
    assert [s["step"] for s in report["steps"]] == list(STEPS)
    assert all(s["status"] == "ok" for s in report["steps"])
    for step in set(STEPS) - SKIPPED_WHOLE:
        assert any(r["step"] == step and r["status"] == "ok" for r in report["results"]), f"no figures for step {step}"
    # step 6 without vllm (the main environment has none): one line saying so, and the step ends ok (above)
    (vllm,) = [r for r in report["results"] if r["step"] == 6]
    assert vllm["status"] == "skipped", vllm
    expected = "vllm not installed" if importlib.util.find_spec("vllm") is None else "dry run"
    assert vllm["reason"].startswith(expected), vllm
    # what needs CUDA says so instead of vanishing
    assert any(r["status"] == "skipped" and "no CUDA" in r.get("reason", "") for r in report["results"])
    parity = [r for r in report["results"] if r["what"].startswith("parity")]
    assert len(parity) == 6 and all(r["max_abs_diff"] <= r["tolerance"] for r in parity)
    assert (out / "gpu-check.log").read_text().count("step: ok") == len(STEPS)
    # step 7: the spliced SAEs with their error term equal the plain forward, and every graph was built
    dictionaries = {r["what"]: r for r in report["results"] if r["step"] == 7}
    (error_term,) = [r for what, r in dictionaries.items() if "error term equal" in what]
    assert error_term["relative"] <= error_term["tolerance"], error_term
    built = [r for what, r in dictionaries.items() if "transcoder graph" in what]
    assert len(built) == 3 and all(r["n_active"] > 0 and r["n_nodes"] > 0 for r in built), built
