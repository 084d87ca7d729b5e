"""examples/quickstart.ipynb runs headless, top to bottom, without a cell error."""

import os

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("tensorflow")  # the notebook's net (the tf extra)
pytest.importorskip("matplotlib")  # and its plot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(ROOT, "examples", "quickstart.ipynb")


@pytest.mark.timeout(240)
def test_quickstart_notebook_executes_and_draws_the_plot():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:  # run from scratch, not from the saved outputs
        if cell.cell_type == "code":
            cell.outputs = []
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": ROOT}})
    client.execute()  # raises CellExecutionError on any cell error
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors
    stdout = "".join(o.get("text", "") for c in code for o in c.outputs
                     if o.output_type == "stream" and o.name == "stdout")
    assert "batched:" in stdout and "baseline:" in stdout
    assert "pretrained connect_four vs one-ply:" in stdout
    assert "learned heuristic:" in stdout and "manhattan heuristic:" in stdout
    images = [o for c in code for o in c.outputs
              if o.output_type == "display_data" and "image/png" in o.get("data", {})]
    assert len(images) == 1
    stats = [o["data"]["text/plain"] for o in code[1].outputs
             if o.output_type == "execute_result"]
    assert stats and "'mean_batch_size'" in stats[0]
