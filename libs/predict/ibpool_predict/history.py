"""Submit-time features of a job, computed from the jobs that finished before it was submitted.

`FinishedJobHistory` records every finished job's log-runtime under several scopes of similarity
(same tenant and GPU count, same tenant, same GPU count, same tenant and name, everyone), each as a
series ordered by finish time. `features_at(job)` looks only at the part of each series that
finished strictly before `job.submit_time` (a bisection), so a row never sees the future however
late it is computed: that is what makes a trace replay honest and a late `observe` harmless.
"""

from __future__ import annotations

import bisect
import datetime as dt
import math
from collections.abc import Hashable

from .contract import JobFeaturesLike

# Similarity scopes, from the most to the least specific.
SCOPES: tuple[str, ...] = ("tenant_gpus", "tenant", "gpus", "tenant_name", "all")
# Per scope: log1p(count), the last log-runtime, medians of the last 5 and 50, spread of the last 50,
# mean over everything finished so far, log1p of jobs finished in the last hour and of the seconds
# since the last one finished (bursts of short, failing jobs show up there).
SCOPE_STATS: tuple[str, ...] = (
    "log_count",
    "last",
    "median_5",
    "median_50",
    "std_50",
    "mean_all",
    "log_finished_last_hour",
    "log_since_last_finish",
)
JOB_FEATURES: tuple[str, ...] = ("log2_gpus", "log_requested_limit", "hour_of_day", "day_of_week")
# The tenant itself is a categorical column the model adds in front of these (see model.py).
FEATURE_NAMES: tuple[str, ...] = JOB_FEATURES + tuple(f"{s}.{v}" for s in SCOPES for v in SCOPE_STATS)

NAN = float("nan")
_Stats = tuple[float, float, float, float, float, float, float, float]
_EMPTY_STATS: _Stats = (0.0, NAN, NAN, NAN, NAN, NAN, 0.0, NAN)
_UNKNOWN_STATS: _Stats = (NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN)
_MEMO_SIZE = 16  # memoised prefixes per series (a replay asks for a new one per job: keep it small)


def log_runtime(runtime_s: float) -> float:
    """The learning target: log of the runtime, floored at one second (traces round to seconds)."""
    return math.log(max(runtime_s, 1.0))


class _Series:
    """Finished jobs of one scope ordered by finish time, with running sums for the all-time mean.

    Only the newest `keep` to `2 * keep` entries are held; `dropped` and `prefix[0]` carry the count and
    sum of older ones, so counts and means still cover everything. A question about a time at or before
    the newest dropped finish cannot be answered without the future, so it gets `_UNKNOWN_STATS`.
    """

    __slots__ = ("dropped", "dropped_until", "finish_times", "keep", "logs", "memo", "prefix")

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.dropped = 0
        self.dropped_until = -math.inf  # finish time of the newest dropped entry
        self.finish_times: list[float] = []
        self.logs: list[float] = []
        self.prefix: list[float] = [0.0]  # prefix[i] = sum of every log before held entry i
        # i -> the stats of entries [0, i) that do not depend on the time asked about. Queued jobs
        # submitted after the newest finish all ask for the same i: a batch of them computes it once.
        self.memo: dict[int, tuple[float, float, float, float, float, float]] = {}

    def add(self, finished_at: float, log_value: float) -> None:
        if not self.finish_times or finished_at >= self.finish_times[-1]:
            self.finish_times.append(finished_at)
            self.logs.append(log_value)
            self.prefix.append(self.prefix[-1] + log_value)
        else:  # out of finish order: insert and redo the sums after it
            i = bisect.bisect_right(self.finish_times, finished_at)
            self.finish_times.insert(i, finished_at)
            self.logs.insert(i, log_value)
            del self.prefix[i + 1 :]
            for v in self.logs[i:]:
                self.prefix.append(self.prefix[-1] + v)
            self.memo.clear()  # the entries from i on moved
        if len(self.logs) > 2 * self.keep:
            cut = len(self.logs) - self.keep
            self.dropped += cut
            self.dropped_until = self.finish_times[cut - 1]
            del self.finish_times[:cut], self.logs[:cut], self.prefix[:cut]
            self.memo.clear()  # indices shifted

    def stats_before(self, t: float) -> _Stats:
        if t <= self.dropped_until:  # some dropped job finished at or after t: its count is not the past's
            return _UNKNOWN_STATS
        i = bisect.bisect_left(self.finish_times, t)  # entries [0, i) finished strictly before t
        n = self.dropped + i
        if n == 0:
            return _EMPTY_STATS
        if i == 0:  # everything before t has been dropped: only the count and all-time mean are left
            return (math.log1p(n), NAN, NAN, NAN, NAN, self.prefix[0] / n, NAN, NAN)
        fixed = self.memo.get(i)
        if fixed is None:
            last_50 = self.logs[max(0, i - 50) : i]
            mean_50 = sum(last_50) / len(last_50)
            std_50 = math.sqrt(sum([(v - mean_50) ** 2 for v in last_50]) / len(last_50))
            fixed = (
                math.log1p(n),
                self.logs[i - 1],
                _median(self.logs[max(0, i - 5) : i]),
                _median(last_50),
                std_50,
                self.prefix[i] / n,
            )
            if len(self.memo) >= _MEMO_SIZE:
                self.memo.clear()
            self.memo[i] = fixed
        return (
            *fixed,
            math.log1p(i - bisect.bisect_left(self.finish_times, t - 3_600.0, 0, i)),
            math.log1p(t - self.finish_times[i - 1]),
        )


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def _scope_keys(job: JobFeaturesLike) -> tuple[Hashable | None, ...]:
    """One key per scope in SCOPES order; None where the job has no such key (no name given)."""
    return (
        (job.tenant, job.num_gpus),
        job.tenant,
        job.num_gpus,
        (job.tenant, job.name) if job.name else None,
        (),
    )


class FinishedJobHistory:
    """Finished jobs by similarity scope; answers `features_at(job)` from the past of its submit time only.

    `keep_per_key` bounds memory: each series holds its newest entries (counts and means still
    cover all). `max_keys` bounds how many series a scope holds: job names are free text (a run id
    in each makes one key per job), so past it the key added to longest ago goes. Not thread-safe:
    one owner calls `add` and `features_at`.
    """

    def __init__(self, keep_per_key: int = 5_000, max_keys: int = 50_000) -> None:
        self._keep = keep_per_key
        self._max_keys = max_keys
        self._series: list[dict[Hashable, _Series]] = [{} for _ in SCOPES]

    def add(self, job: JobFeaturesLike, runtime_s: float, finished_at: float) -> None:
        value = log_runtime(runtime_s)
        for by_key, key in zip(self._series, _scope_keys(job), strict=True):
            if key is None:
                continue
            series = by_key.pop(key, None)  # re-inserted last: the dict's order is the order of adds
            if series is None:
                series = _Series(self._keep)
                if len(by_key) >= self._max_keys:
                    del by_key[next(iter(by_key))]
            by_key[key] = series
            series.add(finished_at, value)

    def features_at(self, job: JobFeaturesLike) -> list[float]:
        """The row of FEATURE_NAMES for `job`, from jobs that finished strictly before its submit time."""
        t = job.submit_time
        when = dt.datetime.fromtimestamp(t, dt.UTC)
        limit = job.requested_limit_s
        row = [
            math.log2(job.num_gpus + 1),
            math.log(max(limit, 1.0)) if limit is not None else NAN,
            when.hour + when.minute / 60,
            float(when.weekday()),
        ]
        for by_key, key in zip(self._series, _scope_keys(job), strict=True):
            series = by_key.get(key) if key is not None else None
            row.extend(series.stats_before(t) if series is not None else _EMPTY_STATS)
        return row
