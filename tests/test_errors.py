"""One error hierarchy (matrix_runner/errors.py): every error matrix-run raises on purpose derives
from MatrixRunError with the exit code its table names, keeps its old base (ValueError/RuntimeError)
for older except clauses, and cli.main turns any of them into "error: ..." with that code."""
import pytest

from matrix_runner import build, cli, config, envs, errors, fa3, proc, results, stubgen


@pytest.mark.parametrize("cls, code, old", [
    (envs.UsageError, 2, ValueError), (config.ConfigError, 2, ValueError), (results.ResultsError, 2, ValueError),
    (fa3.TreeError, 2, ValueError), (envs.EnvError, 3, RuntimeError), (build.BuildError, 3, RuntimeError),
    (stubgen.StubError, 3, ValueError), (proc.Stopped, 130, RuntimeError)])
def test_each_error_has_its_exit_code_and_old_base(cls, code, old):
    assert issubclass(cls, errors.MatrixRunError) and issubclass(cls, old) and cls.exit_code == code
    assert cls.__name__ in errors.__doc__


def test_main_reports_any_matrix_run_error_with_its_code(monkeypatch, capsys):
    """An error of ours that reaches main is a message and its code, not an "internal error"."""
    def boom(args, argv):
        raise envs.EnvError("env x: could not be prepared")

    parser = cli.build_parser

    def patched():
        ap = parser()
        ap.set_defaults(func=boom)
        for sp in (ap.get_default("_subparsers") or {}).values():
            sp.set_defaults(func=boom)
        return ap
    monkeypatch.setattr(cli, "build_parser", patched)
    assert cli.main(["plan", "--versions", "2.6.3"]) == 3
    err = capsys.readouterr().err
    assert err.strip() == "error: env x: could not be prepared"
    assert cli.EXIT_USAGE == errors.EXIT_USAGE == 2 and cli.EXIT_INTERRUPTED == 130
