"""scripts/profile_decode.py: where a translation's time goes, on a CPU here and on CUDA where lent."""

import subprocess
import sys

import pytest

from helpers import ROOT, tiny_checkpoint


@pytest.mark.slow
def test_the_profile_translates_in_the_batches_asked_for_and_names_the_host_ops(multi30k, tmp_path):
    checkpoint = tiny_checkpoint(multi30k, tmp_path / "best.pt", steps=0)
    proc = subprocess.run([sys.executable, "scripts/profile_decode.py", "--checkpoint", str(checkpoint), "--input",
                           str(multi30k / "valid.en"), "--lines", "30", "--batch-size", "16", "--max-tokens", "4000",
                           "--top", "5"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "30 lines, beam 4: " in proc.stdout and " sentences/s (under the profiler)" in proc.stdout
    assert "host: aten ops " in proc.stdout and proc.stdout.count(" calls  aten::") == 5
    assert "GPU kernel time" not in proc.stdout  # a CPU: no kernels to report
