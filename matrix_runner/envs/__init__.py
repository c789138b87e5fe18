"""Stage 2 — the env builder: one isolated uv venv per flash-attn version, with an identity record.

For each ``LABEL=VERSION`` the builder

1. *plans* (:func:`plan_env`): the wheel key for this env's torch/python/GPU, and where the wheel
   comes from (reuse of an existing env, ``--find-links``, the wheel cache, the release wheel, a
   slim or full source build) — printed before anything is built;
2. *prepares* (:func:`prepare_env`): reuses ``envs/LABEL`` when its record
   (``matrix-run-env.json``) matches, else creates it with ``uv venv``, makes the torch visible
   (``--torch inherit``: a ``.pth`` listing the driver interpreter's site dirs, so the env sees the
   same torch while its own packages win; ``--torch X.Y.Z``: ``uv pip install torch==X.Y.Z``),
   obtains the wheel, installs it with ``uv pip install --no-deps``, and
3. *preflights* in two steps: right after the install, a check that needs no torch import
   (~0.05 s: ``importlib`` finds flash_attn and its CUDA extension inside the env, with the requested
   version); then the first worker process of the env, which imports torch and flash_attn anyway,
   reports its probe and the runner applies the full check (:func:`check_probe`: imported from inside
   the env, the requested version, the extension loads) before anything is timed. A failure there
   fails the env, not the run, and marks the record so the next run rebuilds it. (Importing torch
   only for a separate preflight process cost ~1.7 s per env on the 2-core CI machine.)

Env records follow asv's idea of an environment identity: reuse only what provably matches.

Which module owns what (each imports, at run time, only the ones above it; the package re-exports
their names):

- :mod:`.record`: the env record (``matrix-run-env.json``) read and written, which directories are
  envs matrix-run made, the rows of ``envs list``, the locks that keep ``envs clean`` off an env in use;
- :mod:`.venv`: the uv venv: uv itself, creating the venv with its torch, installing a wheel or a
  subject, the env's python, the worker's probe, the fingerprint; :class:`EnvError`;
- :mod:`.requests`: what ``--versions`` and ``--torch`` ask for (:class:`EnvRequest`), the version x
  torch matrix, the check that each version and pinned torch exists;
- :mod:`.plan`: step 1: the run's :class:`Options` and each env's :class:`PlanItem` (wheel key, torch
  identity, where the wheel comes from, the compile cache's expected hits);
- :mod:`.preflight`: step 3: the import checks, and the record of the first worker's full check;
- :mod:`.prepare`: step 2: carrying out a plan item into an :class:`EnvResult` (reuse, venv, wheel,
  source builds into the wheel cache), and the ``here`` backend.
"""
from __future__ import annotations

from .. import subjects
from ..errors import UsageError
from .plan import (
    Options,
    PlanItem,
    env_dir_for,
    gpu_archs_from_probe,
    plan_env,
    python_tag,
    same_torch,
    share_jobs,
    torch_identity,
    unit_context,
    unit_keys,
    waits_for_cache,
    wanted_key,
)
from .preflight import STATIC_PROBE, check_probe, record_import_check, static_preflight
from .prepare import EnvResult, Prepared, Progress, prepare_env, prepare_here
from .record import (
    RECORD,
    RECORD_SCHEMA,
    hold_envs,
    is_matrix_run_env,
    list_envs,
    load_record,
    try_exclusive,
    use_lock,
    write_record,
)
from .requests import (
    LABEL_RE,
    EnvRequest,
    check_versions,
    cross_torch,
    parse_torches,
    parse_versions,
)
from .venv import (
    BUILD_DEPS,
    EnvError,
    create_venv,
    driver_site_dirs,
    env_python,
    find_uv,
    fingerprint,
    install_subject,
    install_wheel,
    local_version,
    probe,
)

__all__ = [
    "BUILD_DEPS",
    "LABEL_RE",
    "RECORD",
    "RECORD_SCHEMA",
    "STATIC_PROBE",
    "EnvError",
    "EnvRequest",
    "EnvResult",
    "Options",
    "PlanItem",
    "Prepared",
    "Progress",
    "UsageError",
    "check_probe",
    "check_versions",
    "create_venv",
    "cross_torch",
    "driver_site_dirs",
    "env_dir_for",
    "env_python",
    "find_uv",
    "fingerprint",
    "gpu_archs_from_probe",
    "hold_envs",
    "install_subject",
    "install_wheel",
    "is_matrix_run_env",
    "list_envs",
    "load_record",
    "local_version",
    "parse_torches",
    "parse_versions",
    "plan_env",
    "prepare_env",
    "prepare_here",
    "probe",
    "python_tag",
    "record_import_check",
    "same_torch",
    "share_jobs",
    "static_preflight",
    "subjects",
    "torch_identity",
    "try_exclusive",
    "unit_context",
    "unit_keys",
    "use_lock",
    "waits_for_cache",
    "wanted_key",
    "write_record",
]
