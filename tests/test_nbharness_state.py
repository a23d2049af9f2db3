"The notebook harness runs many notebooks in one process: what one notebook switches off in torch, the next gets back."
import json, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import nbharness


def _nb(path: Path, source: str) -> Path:
    path.write_text(json.dumps({"cells": [{"cell_type": "code", "execution_count": None, "id": "c1", "metadata": {},
                                           "outputs": [], "source": source}],
                                "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
                                "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_a_notebook_that_turns_gradients_off_leaves_them_on_for_the_next(tmp_path):
    import torch
    off = _nb(tmp_path / "a_off.ipynb", "import torch\ntorch.set_grad_enabled(False)\ntorch.set_default_dtype(torch.float64)")
    on = _nb(tmp_path / "b_on.ipynb", "import torch\nassert torch.is_grad_enabled()\nassert torch.get_default_dtype() == torch.float32")
    try:
        assert nbharness.run_notebook(off)["ok"] and not torch.is_grad_enabled()
        r = nbharness.run_notebook(on)
        assert r["ok"], r["error"]
    finally:
        torch.set_grad_enabled(True); torch.set_default_dtype(torch.float32)
