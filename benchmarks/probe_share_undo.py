"""A run made with ``sampling.probe_share: estimated`` judged both ways: as run, and with every set's
between-worker shift (``speed_by_set[set]["between"]``, runner.apply_probe_share) undone -- the values
the ``full`` rule (the default before the late evening of 2026-12-04)
gives on the same cycles (nearly: probe_center_replay.undone). Prints per run the batch-2 forward/backward and
batch-512 forward wall half-widths (%, widths.hw), the verdicts and the intervals inside +-3 % of 1.
Usage: python benchmarks/probe_share_undo.py RUN [RUN ...]
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import probe_center_replay as P  # noqa: E402
from widths import hw, inside  # noqa: E402

from matrix_runner import results  # noqa: E402

for r in sys.argv[1:]:
    d=results.load(results.find(r)); f=P.undone(d)
    for name,doc in (('as run (estimated)',d),('full (undone)',f)):
        w=[c for c in P.judged(doc) if c['metric']=='wall_us']
        print(r.split('/')[-1], name, 'B2 fwd', '/'.join(f"{hw(c):.2f}" for c in w if c['label'].startswith('B2 ') and c['op']=='fwd'), 'B2 bwd', '/'.join(f"{hw(c):.2f}" for c in w if c['label'].startswith('B2 ') and c['op']=='bwd'), 'B512 fwd', '/'.join(f"{hw(c):.2f}" for c in w if c['label'].startswith('B512 ') and c['op']=='fwd'), 'verdicts', {v:sum(c['verdict']==v for c in w) for v in ('same','slower','ambiguous')}, 'inside', sum(inside(c) for c in w))
