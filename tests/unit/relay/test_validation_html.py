"""What enqueue checks of an HTML body (its size, not its markup) and of inline images."""

from __future__ import annotations

from pathlib import Path

import pytest

from postroom.relay.errors import InvalidAttachmentError, InvalidEmailError
from postroom.relay.validation import MAX_HTML_BYTES, check_html, check_inline


@pytest.mark.parametrize("html", [None, "", "<p>fine</p>", "<unclosed <<markup", "é" * (MAX_HTML_BYTES // 2)])
def test_html_of_any_markup_within_the_size_is_taken_as_it_is(html: str | None) -> None:
    assert check_html(html) == html


@pytest.mark.parametrize(("html", "problem"), [
    ("x" * (MAX_HTML_BYTES + 1), f"over the limit of {MAX_HTML_BYTES}"),
    ("é" * (MAX_HTML_BYTES // 2 + 1), "bytes, over the limit"),  # bytes, not characters
    ("<p>\x00</p>", "NUL"),
    # Not text: refused as bad input (an EnqueueError a Batch's caller catches), not TypeError.
    (b"<p>hi</p>", "html must be a string, not bytes"),
    (123, "html must be a string, not int"),
    (["<p>"], "html must be a string, not list"),
])
def test_html_refused(html: object, problem: str) -> None:
    with pytest.raises(InvalidEmailError, match=problem):
        check_html(html)


@pytest.fixture
def images(tmp_path: Path) -> Path:
    (tmp_path / "chart.png").write_bytes(b"\x89PNG")
    (tmp_path / "logo.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / "notes.txt").write_text("no image")
    (tmp_path / "big.png").write_bytes(b"x" * 101)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "chart.png").write_bytes(b"\x89PNG")
    return tmp_path


def test_inline_images_become_absolute_paths(images: Path) -> None:
    assert check_inline([images / "chart.png", images / "logo.jpg"], "<img>", 100) == [
        str(images / "chart.png"), str(images / "logo.jpg")]
    assert check_inline([], None, 100) == []


@pytest.mark.parametrize(("names", "html", "error", "problem"), [
    (["chart.png"], None, InvalidEmailError, "need an html body"),
    (["notes.txt"], "<p>", InvalidAttachmentError, "is not an image file"),
    (["missing.png"], "<p>", InvalidAttachmentError, "inline image .* does not exist"),
    (["big.png"], "<p>", InvalidAttachmentError, "over the limit of 100"),
    (["other"], "<p>", InvalidAttachmentError, "not a regular file"),
    (["chart.png", "other/chart.png"], "<p>", InvalidAttachmentError, "two inline images are named"),
])
def test_inline_refused(images: Path, names: list[str], html: str | None,
                        error: type[Exception], problem: str) -> None:
    with pytest.raises(error, match=problem):
        check_inline([images / n for n in names], html, 100)


def test_one_path_instead_of_a_list_is_refused(images: Path) -> None:
    with pytest.raises(InvalidEmailError, match="inline images must be a list"):
        check_inline(str(images / "chart.png"), "<p>", 100)
