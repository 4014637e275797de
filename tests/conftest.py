"""Fixtures shared by the training tests: a small corpus file, and Ctrl-C pressed during training."""

import pytest

import aftalibi.train as training

SPEECHES = ("ROMEO:\nBut, soft! what light through yonder window breaks?\nIt is the east, and Juliet is the sun.\n\n"
            "JULIET:\nO Romeo, Romeo! wherefore art thou Romeo?\n\n")


@pytest.fixture
def corpus_file(tmp_path) -> str:
    """A corpus file of the two speeches, 60 times: enough characters for a tiny run's two splits."""
    path = tmp_path / "corpus.txt"
    path.write_text(SPEECHES * 60, encoding="utf-8")
    return str(path)


@pytest.fixture
def ctrl_c_at_draw(monkeypatch):
    """`ctrl_c_at_draw(n)`: training's n-th batch draw from now on raises KeyboardInterrupt, as Ctrl-C
    pressed while a step is being prepared; `ctrl_c_at_draw(None)` lets training run on."""
    draw, plan = training.sample_windows, {"draws": 0, "at": None}

    def interrupted_draw(*args, **kwargs):
        plan["draws"] += 1
        if plan["draws"] == plan["at"]:
            raise KeyboardInterrupt
        return draw(*args, **kwargs)

    monkeypatch.setattr(training, "sample_windows", interrupted_draw)

    def press_at(draw_number: int | None):
        plan.update(draws=0, at=draw_number)

    return press_at
