"""The one selection parser behind every --layer/--head option: examples, errors, and properties."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnviz.errors import SelectionError
from attnviz.base.selection import Selection


def resolve(spec, n, what="layer", keywords=()):
    return Selection.parse(spec, what, keywords=keywords).resolve(n)


@pytest.mark.parametrize("spec,n,expected", [
    ("0", 6, [0]), ("-1", 6, [5]), ("0-2", 6, [0, 1, 2]), ("0,3,5", 6, [0, 3, 5]), ("all", 3, [0, 1, 2]),
    ("5,0", 6, [5, 0]), ("0-2,1", 6, [0, 1, 2]), ("-3--1", 6, [3, 4, 5]), ("-2-3", 4, [2, 3]),
    (" 1 , 2 ", 6, [1, 2]), ("ALL", 2, [0, 1]), ("2 - 4", 6, [2, 3, 4]),
])
def test_examples(spec, n, expected):
    assert resolve(spec, n) == expected


def test_keywords_only_where_allowed():
    assert resolve("mean", 4, "head", ("mean", "max")) == ["mean"]
    assert resolve("0,max", 4, "head", ("mean", "max")) == [0, "max"]
    with pytest.raises(SelectionError, match="not a layer selection"):
        Selection.parse("mean", "layer")
    with pytest.raises(SelectionError, match="cannot be used here"):
        Selection.parse("mean", "head", keywords=("mean",)).indices(4)


@pytest.mark.parametrize("spec,message", [
    ("", "empty"), ("   ", "empty"), ("0,,1", "empty item"), ("5-2", "reversed; write 2-5"), ("x", "not a layer"),
    ("1e30", "not a layer"), ("0-1e30", "not a layer"), ("0-", "not a layer"), ("1.5", "not a layer"),
    ("0" * 2000, "characters long"), ("0-1-2", "not a layer"),
])
def test_malformed_specs_say_what_is_valid(spec, message):
    with pytest.raises(SelectionError, match=message) as info:
        Selection.parse(spec, "layer")
    assert "0-2" in str(info.value) or "reversed" in str(info.value)  # the message shows valid forms


@pytest.mark.parametrize("spec,n,message", [
    ("7", 6, r"layer 7 is out of range: there are 6 layers \(0\.\.5"),
    ("-7", 6, "out of range"),
    ("0-999999999999999999", 6, "out of range"),  # bounds are checked before anything is expanded
    ("-1-0", 6, "reversed"),  # -1 is 5: 5..0 runs backwards
])
def test_resolution_errors(spec, n, message):
    with pytest.raises(SelectionError, match=message):
        resolve(spec, n)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30), st.integers(1, 40))
def test_any_string_parses_or_fails_cleanly(spec, n):
    """Whatever is typed: a Selection whose resolution is non-empty, in range and without repeats, or a
    SelectionError. Never an empty selection, never another exception."""
    try:
        chosen = resolve(spec, n)
    except SelectionError:
        return
    assert chosen and len(set(chosen)) == len(chosen)
    assert all(isinstance(c, int) and 0 <= c < n for c in chosen)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 30).flatmap(lambda n: st.tuples(st.just(n), st.lists(
    st.one_of(st.integers(-n, n - 1).map(str),
              st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).map(lambda t: f"{min(t)}-{max(t)}")),
    min_size=1, max_size=5))))
def test_valid_specs_select_what_they_name(case):
    n, items = case
    chosen = resolve(",".join(items), n)
    expected = []
    for item in items:
        if "-" in item[1:]:
            first, last = map(int, item.split("-"))
            values = range(first, last + 1)
        else:
            values = [int(item) % n]
        expected += [v for v in values if v not in expected]
    assert chosen == expected
