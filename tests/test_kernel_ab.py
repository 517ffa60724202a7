"""The kernel A/B script's build loading and its backward front, on the CPU (the timing needs a GPU)."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("kernel_ab", ROOT / "benchmarks/kernel_ab.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_builds_load_by_label_beside_the_checkout(tmp_path):
    ab = _script()
    # (A copy of kernels/fwd.py would also register its variants a second time in this process.)
    other = tmp_path / "fwd_other.py"
    other.write_text("BUILD = 'other'\n")
    builds = ab.load_builds("fwd", [f"other={other}"])
    assert list(builds) == ["other", "checkout"]
    assert builds["checkout"] is ab.CHECKOUT["fwd"] and builds["other"].BUILD == "other"


@pytest.mark.parametrize("spec", ["no-equals-sign", "=path.py", "checkout=kernels/fwd.py"])
def test_a_bad_build_is_refused(spec):
    with pytest.raises(SystemExit, match="LABEL=PATH"):
        _script().load_builds("fwd", [spec])


def test_the_backward_front_says_what_it_needs(tmp_path):
    # Without a GPU it must stop at the device check, having taken its options apart.
    run = subprocess.run([sys.executable, "benchmarks/bwd_ab.py", "--before", str(ROOT / "kernels/bwd.py"),
                          "--label-before", "same", "--out", str(tmp_path / "ab.json"), "--points", "dense"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    if run.returncode == 0:
        pytest.skip("a GPU is present: the front ran the benchmark")
    assert "needs an sm_90 GPU" in run.stderr, run.stderr[-2000:]
