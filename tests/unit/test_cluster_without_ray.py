"""Without the `cluster` extra nothing changes: no gateway module but `gateway.cluster.ray_agent` imports Ray,
the CLI (a simulated cluster included) runs, and `--cluster ray` says which extra to install.

Each check runs in a child Python whose import system refuses `ray` as if it were not installed (it may be
installed in this venv, for the Ray tests)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

_NO_RAY = """
import importlib.abc, sys
class NoRay(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray' (refused by the test)")
        return None
sys.meta_path.insert(0, NoRay())
"""


def _run(body: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _NO_RAY + body], capture_output=True, text=True, timeout=120,
                          cwd=REPO, check=False)  # fmt: skip


def test_no_gateway_module_imports_ray() -> None:
    modules = sorted(
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        for p in (REPO / "gateway").rglob("*.py")
        if p.name != "__main__.py" and p.stem != "ray_agent"
    )
    done = _run(f"import importlib\nfor m in {modules!r}: importlib.import_module(m)\n"
                "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert "gateway.cluster.live" in modules and "gateway.cluster.host_agent" in modules


def test_the_cli_plans_a_simulated_cluster_without_ray(tmp_path: Path, smollm2_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text("hosts:\n  a: {gpus: v100-16gb}\n  b: {gpus: none}\n")
    (tmp_path / "c.yaml").write_text(f"models:\n  - {{name: m, sources: [{{gguf: {smollm2_path}}}]}}\n")
    argv = [
        "voltgate",
        "plan",
        "--json",
        "--config",
        str(tmp_path / "c.yaml"),
        "--cluster",
        str(tmp_path / "cluster.yaml"),
    ]
    done = _run(f"sys.argv = {argv!r}\nfrom gateway.cli import main\ntry:\n    main()\nexcept SystemExit as e:\n"
                "    assert not e.code, e.code\nassert 'ray' not in sys.modules\n")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["decisions"][0]["host"] == "a"


def test_plan_against_a_live_cluster_names_the_extra_without_ray(tmp_path: Path, smollm2_path: Path) -> None:
    (tmp_path / "c.yaml").write_text(f"models:\n  - {{name: m, sources: [{{gguf: {smollm2_path}}}]}}\n")
    argv = ["voltgate", "plan", "--config", str(tmp_path / "c.yaml"), "--cluster", "ray"]
    done = _run(f"sys.argv = {argv!r}\nfrom gateway.cli import main\nmain()\n")
    assert done.returncode == 2
    assert "pip install 'voltgate[cluster]'" in done.stderr


def test_serve_against_a_cluster_names_the_extra_without_ray_and_refuses_a_cluster_file(
    tmp_path: Path, smollm2_path: Path
) -> None:
    (tmp_path / "c.yaml").write_text(f"models:\n  - {{name: m, sources: [{{gguf: {smollm2_path}}}]}}\n")
    for target, expected in (("ray", "pip install 'voltgate[cluster]'"), ("hosts.yaml", "serving needs a live")):
        argv = ["voltgate", "serve", "--config", str(tmp_path / "c.yaml"), "--cluster", target]
        done = _run(f"sys.argv = {argv!r}\nfrom gateway.cli import main\nmain()\n")
        assert done.returncode == 2, done.stderr
        assert expected in done.stderr.replace("\n", " ")
