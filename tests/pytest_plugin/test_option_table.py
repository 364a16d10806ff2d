"""One table (``pytest_devplug.options``) makes pytest's options and ini keys, the ``devplug conformance`` flags
and the options reference: both command lines accept the same values and refuse the same ones, saying the option and
the value, and the reference lists every option pytest registers."""

from __future__ import annotations

import re

import pytest

from pytest_devplug import cli, options
from pytest_devplug.options import OPTIONS, Option
from pytest_devplug.settings import parse_settings

pytest_plugins = ["pytester"]

#: A valid value of each kind of option without choices.
SAMPLE = {"str": "x", "int": "3", "float": "2.5"}
#: Values no option of that kind takes.
INVALID = {"int": ["2.5", "-1", "many"], "float": ["soon", "-1"], "choice": ["bogus"]}


def _valid(o: Option) -> list[str | None]:
    """Every choice (a switch: None, the flag alone), or a sample of its kind; a list option also several, and none."""
    if o.kind == "switch":
        return [None]
    if o.several:
        return [*o.choices, ",".join(o.choices[:2]), "none"]
    return list(o.choices) or [SAMPLE[o.kind]]


def _invalid(o: Option) -> list[str]:
    return INVALID["choice"] if o.choices else INVALID.get(o.kind, [])


VALID = [pytest.param(o, v, id=f"{o.name}={v}") for o in OPTIONS for v in _valid(o)]
REFUSED = [pytest.param(o, v, id=f"{o.name}={v}") for o in OPTIONS for v in _invalid(o)]


def _conformance(*argv: str) -> list[str]:
    """The pytest arguments ``devplug conformance ARGV`` hands its options on as."""
    args = cli.build_parser().parse_args(["conformance", *argv])
    return [*options.cli_pytest_args(args), *[a for a in args.pytest_args if a != "--"]]


@pytest.mark.parametrize("o, value", VALID)
def test_cli_and_pytest_accept_the_same_values(pytester: pytest.Pytester, o: Option, value: str | None) -> None:
    """The value goes through ``devplug conformance`` (its own flag, or after ``--`` for an option it has no flag
    for) and the pytest arguments it becomes through pytest's parser, which keeps it as the table checks it."""
    flag = o.cli if o.cli is not None else o.flag
    given = [flag] if value is None else [flag, value]
    forwarded = _conformance(*given) if o.cli is not None else _conformance("--", *given)
    if o.cli is not None:
        assert forwarded == ([o.flag] if value is None else [f"{o.flag}={o.check(value)}"])
    config = pytester.parseconfig(*forwarded)
    assert config.getoption(o.dest) == (True if value is None else o.check(value))


@pytest.mark.parametrize("o", [o for o in OPTIONS if o.negative], ids=lambda o: o.name)
def test_a_switch_turned_off_is_off_in_both(pytester: pytest.Pytester, o: Option) -> None:
    assert o.cli is not None
    forwarded = _conformance(f"--{o.negative}")
    assert forwarded == [f"--devplug-{o.negative}"]
    assert pytester.parseconfig(*forwarded).getoption(o.dest) is False


@pytest.mark.parametrize("o, value", REFUSED)
def test_cli_pytest_and_ini_refuse_the_same_values(
    pytester: pytest.Pytester, capsys: pytest.CaptureFixture[str], o: Option, value: str
) -> None:
    """Refused by ``devplug conformance`` before pytest starts, by pytest's parser and in the ini file, each error
    naming the option and the value."""
    if o.cli is not None:
        with pytest.raises(SystemExit) as exited:
            cli.build_parser().parse_args(["conformance", o.cli, value])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {o.cli}: {value!r}" in err, err
    with pytest.raises(pytest.UsageError) as refused:
        pytester.parseconfig(o.flag, value)
    assert f"argument {o.flag}: {value!r}" in str(refused.value)
    assert o.ini is not None
    pytester.makeini(f"[pytest]\n{o.ini} = {value}\n")
    with pytest.raises(pytest.UsageError) as refused:
        options.value(pytester.parseconfig(), o.name)
    assert f"(ini {o.ini}) = {value!r}" in str(refused.value)


def test_reference_lists_every_registered_option_and_ini_key(pytester: pytest.Pytester) -> None:
    help_text = pytester.runpytest("--help").stdout.str()
    registered = set(re.findall(r"^\s+(--devplug-[a-z0-9-]+)", help_text, re.M))
    ini_keys = set(re.findall(r"^\s+(devplug_[a-z0-9_]+) \(", help_text, re.M))
    ours = [o for o in OPTIONS if o.group == "devplug"]
    assert registered == {o.flag for o in ours} | {f"--devplug-{o.negative}" for o in ours if o.negative}
    assert ini_keys == {o.ini for o in ours}
    reference = options.options_markdown()
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in reference.splitlines()[2:]}
    cells = " ".join(rows)
    assert [f for f in sorted(registered) if f"`{f}`" not in cells] == []
    assert [k for k in sorted(ini_keys) if f"`{k}`" not in reference] == []
    for flag in ("--cluster-name", "--keep-cluster", "--kind-bin", "--kind-image", "--kubeconfig"):
        assert flag in help_text and f"`{flag}`" in cells


def test_reference_rows_carry_the_tables_default_cli_flag_and_choices() -> None:
    reference = options.options_markdown()
    backend = next(line for line in reference.splitlines() if line.startswith("| `--devplug-backend` |"))
    assert backend.split(" | ")[1:5] == ["`devplug_backend`", "`--backend`", "sim", "sim, kind, cluster"]
    soak = next(line for line in reference.splitlines() if line.startswith("| `--devplug-soak` |"))
    assert soak.split(" | ")[1:5] == ["`devplug_soak`", "—", "30", "—"]


def test_help_never_restates_a_default_by_hand() -> None:
    """Defaults are rendered from the table (``default``/``default_text``), so the help cannot drift from them."""
    hand_written = [o.name for o in OPTIONS if re.search(r"\(default|default:|Default", o.help)]
    assert hand_written == []
    assert options.option("timeout").help_text().endswith("(default: 20)")


EXAMPLES = [pytest.param(o, id=o.name) for o in OPTIONS if o.example is not None]


@pytest.mark.parametrize("o", EXAMPLES)
def test_every_help_example_is_taken_at_the_default_release(pytester: pytest.Pytester, o: Option) -> None:
    """What a help text shows as an example goes through ``devplug conformance``, pytest's parser and the settings
    (feature gates checked against the default release's locks and dependencies) without an error, and the help
    shows it in place."""
    assert o.example is not None and o.example in o.help_text() and "{example}" not in o.help_text()
    forwarded = _conformance(o.cli, o.example) if o.cli is not None else _conformance("--", o.flag, o.example)
    config = pytester.parseconfig(*forwarded)
    assert config.getoption(o.dest) == o.example
    parse_settings(config)  # raises pytest.UsageError naming the option when the example is refused


def test_a_planted_bad_example_is_caught(pytester: pytest.Pytester) -> None:
    """The check above can fail: the example the feature-gates help once gave is refused at 1.37 (its gates'
    dependants stay on)."""
    config = pytester.parseconfig("--devplug-feature-gates", "DRADeviceTaints=false,ResourceHealthStatus=false")
    with pytest.raises(pytest.UsageError, match="depends on features that are disabled"):
        parse_settings(config)
