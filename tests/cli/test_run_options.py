"""The run options have one owner, launcher.options.RunOptions: its defaults are the command line's
and launch()'s, its checks word their errors for whichever front end is in effect, and the host
agent's own copy of a default (it imports nothing of tflaunch's) agrees with it."""

from __future__ import annotations

import ast
import inspect
from dataclasses import MISSING, fields, replace
from pathlib import Path

import pytest

from launcher import api
from launcher.agent import starting
from launcher.cli import main
from launcher.cli.group import cli
from launcher.errors import LaunchError, OptionsError
from launcher.options import EVALUATOR_TIMEOUT, GRACE, MAX_RESTARTS, RESTART_DELAY, RunOptions, python_words

pytestmark = pytest.mark.unit

LAUNCHER = Path(__file__).resolve().parents[2] / "launcher"
OPTIONS = {option.name: option for option in fields(RunOptions)}
FLAGGED = [name for name in OPTIONS if name != "command"]  # the command comes after --, not from a flag


def default_of(name: str):
    option = OPTIONS[name]
    return option.default_factory() if option.default_factory is not MISSING else option.default


def test_the_defaults():
    options = RunOptions()
    assert (options.grace, options.evaluator_timeout) == (GRACE, EVALUATOR_TIMEOUT) == (5.0, 300.0)
    # None: the cluster file's setting (whose own defaults are MAX_RESTARTS and RESTART_DELAY), or no timeout.
    assert (options.max_restarts, options.restart_delay, options.threads, options.log_dir) == (None,) * 4
    assert (options.start_timeout, options.hang_timeout, options.command) == (None,) * 3
    assert (options.env, options.tasks) == ({}, ())
    assert not any((options.isolate_network, options.no_check, options.quiet, options.verbose, options.tensorboard))
    assert (MAX_RESTARTS, RESTART_DELAY) == (0, 1.0)


def test_values_are_put_in_one_form():
    options = RunOptions(command="python train.py --lr '0.1 0.2'", grace=2, tasks=" worker-0, chief-0,",
                         log_dir=Path("/tmp/runs"), restart_delay=0, env=None, quiet=1)
    assert options.command == ("python", "train.py", "--lr", "0.1 0.2")
    assert options.grace == 2.0 and isinstance(options.grace, float)
    assert options.tasks == ("worker-0", "chief-0") == RunOptions(tasks=["worker-0", "chief-0"]).tasks
    assert options.log_dir == "/tmp/runs" and options.restart_delay == 0.0 and options.env == {}
    assert options.quiet is True
    assert RunOptions(threads=4).threads == 4 and RunOptions(threads="off").threads == "off"


# (option, value, expected, value as the message shows it): each check, in both front ends' words.
BAD = [
    ("grace", -1, "a number of seconds >= 0", "-1"),
    ("grace", "soon", "a number of seconds >= 0", "'soon'"),
    ("grace", float("nan"), "a number of seconds >= 0", "nan"),
    ("evaluator_timeout", True, "a number of seconds >= 0", "True"),
    ("restart_delay", -0.5, "a number of seconds >= 0", "-0.5"),
    ("straggler_warm_up", -5, "a number of seconds >= 0", "-5"),
    ("straggler_window", 2, "a number of seconds >= 5", "2"),
    ("start_timeout", 0, "a number of seconds > 0", "0"),
    ("hang_timeout", float("inf"), "a number of seconds > 0", "inf"),
    ("max_restarts", -1, "a whole number >= 0", "-1"),
    ("max_restarts", 1.5, "a whole number >= 0", "1.5"),
    ("threads", 0, "'auto', 'off' or a thread count >= 1", "0"),
    ("threads", "many", "'auto', 'off' or a thread count >= 1", "'many'"),
    ("command", [], "a non-empty list of strings, or a string", "[]"),
    ("tasks", 7, "task names such as 'worker-0,chief-0' or ['worker-0', 'chief-0']", "7"),
    ("log_dir", 3, "a path", "3"),
    ("env", {"A-B": "1"}, "variable names mapped to strings, or to None (passed by name)", "'A-B'"),
]
CLI_NAMES = {"grace": "--grace", "evaluator_timeout": "--evaluator-timeout", "restart_delay": "--restart-delay",
             "straggler_warm_up": "--straggler-warm-up", "straggler_window": "--straggler-window",
             "start_timeout": "--start-timeout", "hang_timeout": "--hang-timeout", "max_restarts": "--max-restarts",
             "threads": "--threads", "command": "the command after --", "tasks": "--tasks", "log_dir": "--log-dir",
             "env": "--env"}


@pytest.mark.parametrize("option, value, expected, shown", BAD, ids=[f"{b[0]}={b[3]}" for b in BAD])
def test_a_bad_value_is_named_in_flag_words_and_in_keyword_words(option, value, expected, shown):
    with pytest.raises(OptionsError) as flags:
        RunOptions(**{option: value})
    assert str(flags.value) == f"{CLI_NAMES[option]}: expected {expected}, got {shown}"
    assert flags.value.exit_code == 2 and isinstance(flags.value, LaunchError)
    with python_words(), pytest.raises(OptionsError) as keywords:
        RunOptions(**{option: value})
    assert str(keywords.value) == f"{option}: expected {expected}, got {shown}"


def test_a_secret_value_is_never_in_the_message():
    with python_words(), pytest.raises(OptionsError) as error:
        RunOptions(env={"API_KEY": 12345})
    assert str(error.value) == "env['API_KEY']: expected a string, or None to pass this process's own value by name, " \
                               "got 'int'"
    assert "12345" not in str(error.value)


def test_options_that_do_not_go_together():
    with pytest.raises(OptionsError, match=r"^--quiet and --verbose cannot be combined$"):
        RunOptions(quiet=True, verbose=True)
    with python_words(), pytest.raises(OptionsError, match=r"^launch\(\): quiet=True and verbose=True cannot be"):
        RunOptions(quiet=True, verbose=True)


def test_replace_checks_again():
    with pytest.raises(OptionsError, match="--grace"):
        replace(RunOptions(), grace=-2)


# -- the front ends take their defaults from RunOptions --------------------------------------

def test_the_command_lines_defaults_are_the_dataclasss():
    run = cli.get_command(None, "run")
    context = run.make_context("run", ["--local", "1"])  # parses and runs each flag's parser; starts nothing
    parsed = RunOptions(**{name: context.params[name] for name in FLAGGED})
    for name in FLAGGED:
        assert getattr(parsed, name) == default_of(name), name
    assert parsed == RunOptions()
    by_name = {param.name: param for param in run.params}
    assert by_name["grace"].default == GRACE and by_name["evaluator_timeout"].default == EVALUATOR_TIMEOUT


def test_the_command_line_shows_each_options_help():
    run = cli.get_command(None, "run")
    by_name = {param.name: param for param in run.params}
    for name in FLAGGED:
        assert by_name[name].help == OPTIONS[name].metadata["help"], name
    assert "else 0)" in by_name["max_restarts"].help and "else 1)" in by_name["restart_delay"].help


def test_submit_shows_the_same_run_options():
    submit = cli.get_command(None, "submit")
    run = cli.get_command(None, "run")
    runs = {param.name: param for param in run.params}
    passed = submit.make_context("submit", ["--nodes", "1"]).params
    shared = [param for param in submit.params if param.name in OPTIONS]
    assert sorted(param.name for param in shared) == ["env", "grace", "keepalive_timeout", "log_dir", "log_group",
                                                         "max_restarts", "restart_delay"]
    for param in shared:
        assert (param.opts, param.metavar) == (runs[param.name].opts, runs[param.name].metavar), param.name
        # --env's help says what submit writes into the script and what it refuses.
        assert param.help == runs[param.name].help or param.name == "env", param.name
        assert passed[param.name] == ({} if param.name == "env" else None)  # passed on to the job only when given


def test_launch_s_defaults_are_the_dataclasss():
    signature = inspect.signature(api.launch).parameters
    shared = [name for name in OPTIONS if name in signature]
    assert sorted(shared) == sorted(OPTIONS)  # launch() takes every run option by its name
    given = {name: signature[name].default for name in shared}
    assert RunOptions(**given) == RunOptions()
    assert given["grace"] == GRACE and given["evaluator_timeout"] == EVALUATOR_TIMEOUT


@pytest.mark.parametrize("argv, message", [
    (["--local", "1", "--grace", "-1", "--dry-run"], "--grace: expected a number of seconds >= 0, got -1.0"),
    (["--local", "1", "--threads", "0", "--dry-run"], "--threads: expected 'auto', 'off' or a thread count >= 1, got 0"),
    (["--local", "1", "--hang-timeout", "0", "--dry-run"], "--hang-timeout: expected a number of seconds > 0, got 0.0"),
    (["--local", "1", "--straggler-warm-up", "-1", "--dry-run"],
     "--straggler-warm-up: expected a number of seconds >= 0, got -1.0"),
    (["--local", "1", "--quiet", "--verbose", "--dry-run"], "--quiet and --verbose cannot be combined"),
    (["submit", "--nodes", "1", "--max-restarts", "-1", "--dry-run"],
     "--max-restarts: expected a whole number >= 0, got -1"),
    (["export", "--local", "1", "--max-restarts", "-1", "--format", "sh"],
     "--max-restarts: expected a whole number >= 0, got -1"),
])
def test_the_command_line_reports_a_bad_value_in_one_line(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"tflaunch: error: {message}"]
    assert not (tmp_path / "logs").exists()


# -- one copy of each default --------------------------------------------------------------

def test_the_agents_own_default_grace_is_tflaunchs():
    # The agent is shipped as standalone source: tflaunch's default is the agent's number.
    assert starting.Process(1, {}).grace == GRACE == RunOptions().grace
    assert starting.Process(1, {"grace": "2.5"}).grace == 2.5


SPELLED_ONCE = {"grace", "evaluator_timeout", "restart_delay", "max_restarts", "task_restarts", "eof_grace",
                "keepalive", "keepalive_timeout", "connect_timeout"}
# What takes and passes on run options: the front ends, the run, the transports, the cluster and its
# sources. (A run record's fields, an export's plan and TensorBoard's own stop are other facts.)
SCOPE = ("api.py", "cli", "run", "transports", "cluster", "sources", "slurm")
OWNERS = {LAUNCHER / "options.py"}  # the agent (launcher/agent, outside the scope) keeps its own copy, tested above


def literal_defaults(tree: ast.AST) -> list[tuple[int, str]]:
    """Parameters and dataclass fields named like a run option's setting whose default is a number."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            positional = args.posonlyargs + args.args
            pairs = list(zip(positional[len(positional) - len(args.defaults):], args.defaults))
            pairs += [(arg, default) for arg, default in zip(args.kwonlyargs, args.kw_defaults) if default is not None]
            found += [(default.lineno, arg.arg) for arg, default in pairs
                      if arg.arg in SPELLED_ONCE and isinstance(default, ast.Constant)
                      and isinstance(default.value, (int, float)) and not isinstance(default.value, bool)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            if (node.target.id in SPELLED_ONCE and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, (int, float))):
                found.append((node.lineno, node.target.id))
    return found


def test_the_finder_sees_parameters_and_fields(tmp_path):
    sample = ast.parse("def f(a, grace=5.0, *, evaluator_timeout: float = 300.0, keepalive=None): pass\n"
                       "class C:\n    task_restarts: int = 3\n    max_restarts: int = MAX\n")
    assert sorted(name for _, name in literal_defaults(sample)) == ["evaluator_timeout", "grace", "task_restarts"]


def test_no_module_writes_a_run_options_default_of_its_own():
    spelled = []
    paths = [path for part in SCOPE for path in ([LAUNCHER / part] if part.endswith(".py")
                                                 else sorted((LAUNCHER / part).rglob("*.py")))]
    assert len(paths) > 50
    for path in paths:
        if path not in OWNERS:
            tree = ast.parse(path.read_text(), str(path))
            spelled += [f"{path.relative_to(LAUNCHER.parent)}:{line}: {name}" for line, name in literal_defaults(tree)]
    assert spelled == []


def test_the_options_shown_whole_hide_every_env_value_and_a_secret_in_the_command():
    # The object goes down whole and the trace shows it: a value of --env or a secret argument never shows.
    options = RunOptions(env={"MY_API_TOKEN": "s3cr3t-one", "DATA": "pl4in-two", "HOME": None},
                         command=["python", "train.py", "--api-key", "s3cr3t-three"], grace=2)
    shown = repr(options)
    assert not any(value in shown for value in ("s3cr3t-one", "pl4in-two", "s3cr3t-three"))
    assert "'MY_API_TOKEN': '<hidden>'" in shown and "'train.py'" in shown and "grace=2.0" in shown
    assert options.env["DATA"] == "pl4in-two"  # only what is shown is masked


def test_a_log_group_must_exist_and_be_the_users_own_in_either_front_ends_words():
    import grp
    import os

    with pytest.raises(OptionsError, match="^--log-group: no group 'no-such-group-here' on this machine$"):
        RunOptions(log_group="no-such-group-here")
    with python_words(), pytest.raises(OptionsError, match="^log_group: no group 'no-such-group-here' on this machine$"):
        RunOptions(log_group="no-such-group-here")
    with pytest.raises(OptionsError, match=r"^--log-group: expected the name or number of a group, got \[1\]$"):
        RunOptions(log_group=[1])
    own = grp.getgrgid(os.getegid()).gr_name
    assert RunOptions(log_group=own).log_group == own and RunOptions(log_group=os.getegid()).log_group == str(os.getegid())
