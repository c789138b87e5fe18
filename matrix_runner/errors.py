"""One error hierarchy for what matrix-run raises on purpose, with the exit code each ends in.

Every such error derives from :class:`MatrixRunError` and names its exit code; ``cli.main`` prints
``error: <message>`` and returns that code for any of them (anything else is a bug of ours: "internal
error", exit 4, :data:`EXIT_INTERNAL`, with the traceback). The classes live beside the stage that
raises them and derive from one of these (they also keep ``ValueError``/``RuntimeError`` as before, so
older ``except`` clauses still hold):

====================  ===========================  ==========================================  ====
class                 module                       what                                        exit
====================  ===========================  ==========================================  ====
UsageError            errors (``envs`` re-exports)  bad ``--versions``/``--torch``/path/option   2
ConfigError           config                       a config value breaks a rule                2
ResultsError          results                      a results file missing, not JSON, old schema 2
TreeError             fa3                          not a usable FA3 source tree                2
EnvError              envs                         one env could not be prepared (run goes on)  3
BuildError            build                        a source build failed (its env fails)        3
StubError             stubgen                      the slim-build generator cannot handle it    3
ResultsNotWritten     pipeline                     results.json could not be written (disk)     3
Stopped               proc                         interrupted (SIGINT/SIGTERM)               130
====================  ===========================  ==========================================  ====

Not here on purpose: ``worker.NotInVersion`` (the worker imports only the standard library, torch
and the subject; the driver reads it from the worker's reply), and the runner's internal control-flow
exceptions (``runner.Interrupted``, ``lockstep.WorkerFault``), which never reach the user as errors.
"""
from __future__ import annotations

#: Exit codes of ``matrix-run`` (``matrix-run --help`` lists them).
EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, EXIT_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
#: An unexpected error: a bug of matrix-run's (cli.main prints it with its traceback). Its own code, so
#: that CI can tell it from 3, a failed env or case (new-user trial 2026-12-04).
EXIT_INTERNAL = 4


class MatrixRunError(Exception):
    """Base of every error matrix-run raises on purpose; ``exit_code``: what ``cli.main`` returns."""

    exit_code = EXIT_FAILED


class UsageError(MatrixRunError, ValueError):
    """Bad input the user can fix (an option, a version, a path, a config value): exit code 2."""

    exit_code = EXIT_USAGE


class StageFailed(MatrixRunError, RuntimeError):
    """A stage failed for one env or case (the rest of the run goes on): exit code 3 if it ends the run."""

    exit_code = EXIT_FAILED


class Interrupted(MatrixRunError, RuntimeError):
    """matrix-run was interrupted (SIGINT/SIGTERM): exit code 130."""

    exit_code = EXIT_INTERRUPTED
