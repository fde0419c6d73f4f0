"""A cell's output as the models read it: one token limit per cell, the error first, warnings collapsed."""

from __future__ import annotations

from pathlib import Path

import pytest

from taskweaver_lite.config.settings import Config
from taskweaver_lite.kernel import output as output_module
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.kernel.output import CellOutput, collapse_repeats
from taskweaver_lite.llm.tokens import get_tokenizer

pytestmark = pytest.mark.kernel

TOKENIZER = get_tokenizer()

NOISY_GRID_SEARCH = """
import sys, warnings
for fit in range(70):
    print(f"/site-packages/sklearn/model_selection/_validation.py:{378 + fit % 3}: FitFailedWarning: "
          f"fit {fit} failed: ValueError: Input contains NaN", file=sys.stderr)
print("fitting 5 folds for each of 14 candidates, totalling 70 fits")
def fit(depth):
    if depth == 0:
        raise ValueError("All the 70 fits failed. It is very likely that your model is misconfigured.")
    fit(depth - 1)
fit(25)
"""


def output(tmp_path: Path, max_tokens: int) -> CellOutput:
    return CellOutput(max_tokens=max_tokens, transcript_path=tmp_path / "cell.txt", artifacts_dir=tmp_path, stem="cell-0001")


@pytest.mark.unit
def test_repeated_warning_lines_collapse_into_one_with_a_count_and_data_rows_stay() -> None:
    text = "\n".join([*(f"x.py:{n}: UserWarning: column {n % 2} is constant" for n in range(40)), "row 1  3.5", "row 2  3.5", "done", "done", "done"])
    collapsed = collapse_repeats(text)
    assert collapsed.splitlines()[0] == "x.py:0: UserWarning: column 0 is constant  [repeated 40 times]"
    assert "row 1  3.5" in collapsed and "row 2  3.5" in collapsed, "distinct data rows must not collapse"
    assert collapsed.endswith("done  [repeated 3 times]")


@pytest.mark.unit
def test_all_fields_of_a_cell_share_one_token_limit_and_the_error_comes_first(tmp_path: Path) -> None:
    cell = output(tmp_path, max_tokens=400)
    cell.add("stream", {"name": "stdout", "text": "progress line\n" * 0 + "".join(f"step {n} of 5000\n" for n in range(5000))})
    cell.add("stream", {"name": "stderr", "text": "Warning: slow\n" * 900})
    frames = [f"frame {n}" for n in range(600)]
    cell.add("error", {"ename": "ValueError", "evalue": "All the 70 fits failed", "traceback": [*frames, "ValueError: All the 70 fits failed"]})
    result = cell.finish("grid.fit(X, y)")
    assert result.error is not None and result.error.value == "All the 70 fits failed"
    assert result.error.traceback.endswith("ValueError: All the 70 fits failed"), "the last frames are kept"
    assert "frame 0\n" not in result.error.traceback
    shown = result.prompt_text()
    assert TOKENIZER.count(result.stdout + result.stderr + result.error.value + result.error.traceback) <= 400 + 16
    assert shown.index("Error: ValueError") < shown.index("Output:"), "the error is read first"
    assert "Warning: slow  [repeated 900 times]" in result.stderr
    assert result.full_output_path is not None and "step 4999 of 5000" in Path(result.full_output_path).read_text()


@pytest.mark.unit
def test_a_small_output_is_untouched(tmp_path: Path) -> None:
    cell = output(tmp_path, max_tokens=400)
    cell.add("stream", {"name": "stdout", "text": "total: 42\n"})
    result = cell.finish("print('total: 42')")
    assert result.stdout == "total: 42\n" and result.full_output_path is None


@pytest.mark.unit
def test_the_cell_limit_scales_with_the_window() -> None:
    assert Config.model_validate({"llm": {"context_window": 8_000}}).cell_output_tokens == 718  # an eighth of 8,000 - 2,000 - 256
    assert Config.model_validate({"llm": {"context_window": 32_000}}).cell_output_tokens == 2_000
    assert Config.model_validate({"execution": {"output_tokens": 700}}).cell_output_tokens == 700


@pytest.mark.unit
def test_the_cell_limit_follows_the_code_generators_own_window() -> None:
    # The CodeGenerator reads whole cell outputs: a small code model must not get a big model's share.
    config = Config.model_validate({"llm": {"context_window": 128_000}, "code_generator": {"llm": {"context_window": 8_000}}})
    assert config.cell_output_tokens == 718  # an eighth of its budget, 8,000 - 2,000 (its default reserve) - 256
    with pytest.raises(ValueError, match=r"code_generator\.llm\.context_window"):
        Config.model_validate({"code_generator": {"llm": {"context_window": 8_000}}, "execution": {"output_tokens": 3_000}})


def test_a_noisy_failing_grid_search_in_a_real_kernel_fits_an_8k_windows_share(tmp_path: Path) -> None:
    config = Config.model_validate({"llm": {"context_window": 8_000}, "execution": {"timeout": 60}})
    with KernelExecutor(tmp_path / "session", config=config.execution, output_tokens=config.cell_output_tokens) as executor:
        result = executor.run(NOISY_GRID_SEARCH)
    assert result.error is not None and result.error.name == "ValueError"
    text = result.prompt_text()
    assert "All the 70 fits failed" in text.splitlines()[1], "error name and message right after the outcome"
    assert "raise ValueError" in result.error.traceback, "the raising frame is kept"
    assert "FitFailedWarning" in result.stderr and "[repeated 70 times]" in result.stderr
    assert TOKENIZER.count(text) <= config.cell_output_tokens + 120  # outcome, labels and the variables line on top


@pytest.mark.unit
def test_a_cell_that_prints_without_end_leaves_an_output_file_of_bounded_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A print loop writes gigabytes before its timeout: the file keeps the first part and says how much more there was.
    monkeypatch.setattr(output_module, "TRANSCRIPT_MAX_CHARS", 10_000)
    cell = output(tmp_path, max_tokens=400)
    for n in range(5_000):
        cell.add("stream", {"name": "stdout", "text": f"row {n:05d}\n"})
    result = cell.finish("while True: print(...)")
    saved = Path(str(result.full_output_path)).read_text(encoding="utf-8")
    assert saved.startswith("row 00000\n") and len(saved) < 10_200
    assert saved.rstrip().endswith("[... 40,000 more characters not saved: a cell's output file holds at most 10,000 ...]")
    assert "row 04999" in result.stdout, "the models still see the output's end"
