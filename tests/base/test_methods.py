"""Method families as registries: choices, help and errors read from what is registered."""

from __future__ import annotations

import subprocess
import sys

import pytest

import attnviz
from attnviz.api.attribution.contribution_methods import CONTRIBUTIONS
from attnviz.api.attribution.faithfulness_methods import FAITHFULNESS
from attnviz.api.patching.methods import DISCOVERY, PATCHING
from attnviz.base.methods import Family, Method
from attnviz.errors import UsageError
from helpers import run

FAMILIES = {"faithfulness": (FAITHFULNESS, "--methods"), "patch": (PATCHING, "--method"),
            "discover": (DISCOVERY, "--method"), "contributions": (CONTRIBUTIONS, "--method")}


def test_a_family_registers_lists_and_refuses():
    family: Family = Family("method")

    @family.register
    class One(Method):
        name, title, help = "one", "the first", "does one thing"

    @family.register
    class Two(Method):
        name = "two"

    assert family.names() == ("one", "two") and family.get("one") is One and "two" in family
    assert family.title("one") == "the first" and family.title("two") == "two"
    assert family.help() == "one: does one thing; two"
    with pytest.raises(UsageError, match="method takes one of one, two; got 'three'"):
        family.get("three")
    with pytest.raises(ValueError, match="twice"):
        family.register(One)


def test_the_api_takes_what_is_registered():
    assert attnviz.FAITHFULNESS_METHODS == FAITHFULNESS.names()
    from attnviz.api.attribution.contributions import METHODS as contribution_methods
    from attnviz.api.patching.activation import METHODS as patch_methods
    from attnviz.api.patching.discovery import DISCOVER_METHODS

    assert (patch_methods, DISCOVER_METHODS, contribution_methods) == (PATCHING.names(), DISCOVERY.names(),
                                                                        CONTRIBUTIONS.names())
    for family in (FAITHFULNESS, PATCHING, DISCOVERY, CONTRIBUTIONS):
        for method in family:
            assert method.name and method.help, method  # every choice explained


@pytest.mark.parametrize("command", sorted(FAMILIES))
def test_the_command_lines_help_and_errors_read_the_registry(command):
    family, flag = FAMILIES[command]
    shown = " ".join(run(command, "--help", env={"COLUMNS": "400"}).stdout.split())
    for method in family:
        assert method.name in shown
        assert " ".join(method.help.split()[:4]) in shown, method.name  # its own line of help
    if command == "discover":  # the command line refuses an encoder first (from its config): asked of the API
        with pytest.raises(UsageError) as refused:
            attnviz.discover("a b", "a c", answers=["b", "c"], method="nonsense")
        shown = str(refused.value)
    else:
        args = ["a b", "a c"] if command == "patch" else ["a b"]
        result = run(command, *args, flag, "nonsense", "-m", "minilm")
        assert result.exit_code in (1, 2)
        shown = result.output
    assert all(name in shown for name in family.names()) and "nonsense" in shown


def test_the_registries_import_no_numpy():
    code = ("import sys\nimport attnviz.api.attribution.faithfulness_methods, attnviz.api.patching.methods, "
            "attnviz.api.attribution.contribution_methods\nprint('numpy' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
