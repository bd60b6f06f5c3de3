"""A synthetic file-system namespace that looks like a real distributed file system.

Why: the planner sizes and splits the B-tree from the MetaDataIDs of real keys,
and the benchmarks replay lookups whose cost depends on path length and on how
keys cluster; both need millions of realistic paths, reproducibly, on any
machine. Real namespace dumps (HDFS fsimages) are private and huge, so this
module grows one instead.

Shape (that of a typical HDFS namespace: about one directory per ten files,
most files four to six levels deep, a heavy tail of huge directories and
deep trees; five top-level trees share the entries 40/25/20/8/7 %):

* ``/data/<project>/...``: research and ML data sets, free-form trees;
* ``/warehouse/<db>.db/<table>/dt=YYYY-MM-DD[/hour=HH]/part-NNNNN-<job>-c000.snappy.parquet``;
* ``/home/<user>/...``: dotfiles and free-form trees, odd names with spaces;
* ``/var/log/<service>/YYYY/MM/DD/<service>-<host>.N.log.gz``;
* ``/tmp/<tmpXXXXXXXX>/...``: many small, shallow scratch trees.

The namespace is closed under parents: every entry's parent directory is an
entry too (except ``/`` itself, which is never listed), and parents come before
their children, as in a depth-first dump. Free-form trees are built top-down
by splitting a budget of entries over children with heavy-tailed weights; a
directory's number of subdirectories grows sub-linearly with its budget, so
files lie 2..12 levels deep with a mode of 4..6 whether ``n`` is a thousand or
a million (only the five top-level directories have depth 1). Names are 1 to
about 60 characters: words, numbers, dates, extensions, now and then spaces
or non-ASCII letters (so UTF-8 keys are exercised). Every path is already in
``client_lib.normalize_path`` form.

Speed matters (1.5 million entries take about two seconds): randomness comes from
one ``random.Random``, names are built with plain string operations, and
directories pick one naming style for all their children.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from datetime import date, timedelta
from functools import cache
from itertools import accumulate, pairwise

__all__ = ["MAX_DEPTH", "generate_entries", "generate_paths"]

MAX_DEPTH = 12
"""Deepest entry, in path components (``/a/b`` has depth 2)."""

_WORDS = (
    "data", "raw", "clean", "processed", "staging", "output", "input", "results",
    "models", "checkpoints", "logs", "tmp", "cache", "backup", "archive", "old",
    "new", "final", "test", "train", "eval", "valid", "images", "videos", "audio",
    "text", "docs", "reports", "src", "lib", "bin", "build", "config", "scripts",
    "notebooks", "figures", "plots", "tables", "exports", "imports", "users",
    "events", "clicks", "orders", "sales", "customers", "inventory", "metrics",
    "features", "embeddings", "labels", "annotations", "samples", "shards", "dumps",
    "snapshots", "genomics", "reads", "alignments", "variants", "climate", "sensor",
    "telemetry", "weather", "satellite", "tiles", "frames", "scans", "ct", "mri",
    "x", "y", "a", "b", "misc", "stuff", "work", "projects", "thesis", "paper",
    "draft", "review", "analysis", "pipeline", "etl", "ingest", "daily", "hourly",
    "monthly", "weekly", "summary", "aggregates", "sessions", "pageviews",
    "transactions", "ledger", "payments", "fraud", "recommendations", "search",
    "index", "crawl", "warc", "bert", "resnet", "gpt", "tokenizer", "vocab",
    "hyperparameters", "experiments", "ablation", "baseline", "simulation",
    "mesh", "particles", "trajectories", "openfoam", "lammps", "gromacs",
    "benchmark", "profiling", "traces", "core", "edge", "region", "us-east-1",
    "eu-west", "prod", "dev", "qa", "release", "nightly", "legacy", "migration",
    "internationalization", "configuration", "preprocessing", "postprocessing",
)
_INTL = (
    "données", "résultats", "café", "naïve", "Ångström", "straße", "año",
    "résumé", "führung", "øvelse", "日本語", "データ", "数据", "отчёт", "данные",
    "ελληνικά", "한국어", "çalışma", "zażółć", "München",
)
_SPACED = (
    "New folder", "Copy of report", "My Documents", "Old stuff", "meeting notes",
    "Final version", "To sort", "scan 2019", "Screenshots", "draft v2",
)
_SHORT = (
    "a", "b", "c", "d", "x", "y", "z", "0", "1", "2", "9", "A", "B", "io", "db",
    "ml", "v1", "v2", "01", "qa",
)
_EXTS = (
    ".txt", ".csv", ".json", ".log", ".py", ".md", ".yaml", ".xml", ".pdf",
    ".docx", ".xlsx", ".png", ".jpg", ".tar.gz", ".gz", ".zip", ".ipynb", ".sh",
    ".parquet", ".h5", ".pt", ".bin", ".sql", ".html", ".conf", ".bak", ".orc",
    ".avro", ".c", ".java", "", "",
)
_SEQ_PREFIXES = (
    "part-", "part-r-", "part-m-", "shard-", "img_", "IMG_", "frame", "chunk_",
    "batch-", "sample_", "data_", "seg", "block_", "",
)
_SEQ_EXTS = (
    ".parquet", ".csv", ".csv.gz", ".json", ".jsonl", ".avro", ".orc",
    ".tfrecord", ".jpg", ".png", ".npy", ".bin", ".gz", ".txt", ".wav", ".dcm", "",
)
_DIR_SEQ_PREFIXES = (
    "run_", "exp", "v", "batch-", "shard=", "bucket-", "epoch_", "job_", "worker-",
    "rank", "fold",
)
_DATED_DIR_FORMATS = ("{}", "dt={}", "date={}", "snapshot-{}")
_USERS = (
    "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan",
    "judy", "mallory", "niaj", "olivia", "peggy", "rupert", "sybil", "trent",
    "victor", "walter", "wei", "li", "yuki", "hiroshi", "priya", "arjun", "fatima",
    "omar", "mateo", "sofia", "lukas", "emma", "noah", "chen", "anna", "jdoe",
    "jsmith", "mgarcia", "kwang", "josé", "zoë", "björn", "łukasz", "søren",
    "françois", "müller", "hive", "spark", "airflow", "etl-svc", "jenkins",
)
_DOTFILES = (".bashrc", ".profile", ".bash_history", ".vimrc", ".gitconfig", ".condarc")
_SERVICES = (
    "namenode", "datanode", "resourcemanager", "nodemanager", "hiveserver2",
    "metastore", "zookeeper", "kafka", "spark-history", "oozie", "hbase-master",
    "regionserver", "nginx", "postgresql", "metaflow-agent", "ovs-vswitchd",
)
_TMP_PREFIXES = ("tmp", "hive_", "spark-", "pip-build-", "blockmgr-", "tmp.", "ray_")
_TREES = (("data", 0.40), ("warehouse", 0.25), ("home", 0.20), ("var", 0.08), ("tmp", 0.07))


@cache
def _dates() -> tuple[str, ...]:
    """ISO dates of 9,500 consecutive days from 2000-01-01 (up to late 2025)."""
    start = date(2000, 1, 1)
    return tuple((start + timedelta(days=i)).isoformat() for i in range(9_500))


def _pick(items: Sequence[str], rnd: Callable[[], float]) -> str:
    return items[int(rnd() * len(items))]


def _count(total: int, mean: int) -> int:
    """How many children of mean subtree size ``mean`` share ``total`` entries."""
    return max(1, min(total, round(total / mean)))


def _fresh(name: str, seen: set[str]) -> str:
    """A variant of ``name`` not in ``seen``, numbered before the extension."""
    dot = name.find(".", 1)
    stem, ext = (name, "") if dot < 0 else (name[:dot], name[dot:])
    k = 1
    while f"{stem}-{k}{ext}" in seen:
        k += 1
    return f"{stem}-{k}{ext}"


class _Builder:
    """Grows a namespace into ``out``; each fill method emits exactly its budget."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.out: list[tuple[str, bool]] = []

    # ---------------------------------------------------------------- names

    def _word_name(self) -> str:
        rnd = self.rng.random
        r = rnd()
        if r < 0.5:
            return _pick(_WORDS, rnd)
        if r < 0.68:
            return _pick(_WORDS, rnd) + ("_" if rnd() < 0.6 else "-") + _pick(_WORDS, rnd)
        if r < 0.8:
            return _pick(_WORDS, rnd) + str(int(rnd() * 1000))
        if r < 0.86:
            return _pick(_SHORT, rnd)
        if r < 0.92:
            return _pick(_WORDS, rnd) + "_" + _pick(_dates(), rnd)
        if r < 0.96:
            target = 25 + rnd() * 35
            name = _pick(_WORDS, rnd)
            while len(name) < target:
                name += "_" + _pick(_WORDS, rnd)
            return name[:52].rstrip("_-")
        if r < 0.985:
            return _pick(_SPACED, rnd)
        return _pick(_INTL, rnd)

    def _file_names(self, count: int) -> list[str]:
        """Names of ``count`` files of one directory, in one style as real jobs write them."""
        rnd = self.rng.random
        style = rnd()
        if style < 0.35:
            prefix, ext = _pick(_SEQ_PREFIXES, rnd), _pick(_SEQ_EXTS, rnd)
            width = 3 + int(rnd() * 4)
            start = 0 if rnd() < 0.8 else int(rnd() * 10_000)
            return [f"{prefix}{str(i).zfill(width)}{ext}" for i in range(start, start + count)]
        dates = _dates()
        if style < 0.45 and count < len(dates) // 2:
            stem, ext = _pick(_WORDS, rnd), _pick(_SEQ_EXTS, rnd)
            first = int(rnd() * (len(dates) - count))
            return [f"{stem}-{day}{ext}" for day in dates[first : first + count]]
        word_name = self._word_name
        return [word_name() + _pick(_EXTS, rnd) for _ in range(count)]

    def _dir_names(self, count: int) -> list[str]:
        """Names of ``count`` subdirectories of one directory."""
        rnd = self.rng.random
        style = rnd()
        dates = _dates()
        if style < 0.12 and count < len(dates) // 2:
            fmt = _pick(_DATED_DIR_FORMATS, rnd)
            first = int(rnd() * (len(dates) - count))
            return [fmt.format(day) for day in dates[first : first + count]]
        if style < 0.22:
            prefix = _pick(_DIR_SEQ_PREFIXES, rnd)
            width = 1 + int(rnd() * 4)
            return [f"{prefix}{str(i).zfill(width)}" for i in range(count)]
        word_name = self._word_name
        return [word_name() for _ in range(count)]

    def _hex(self, digits: int) -> str:
        return f"{self.rng.getrandbits(4 * digits):0{digits}x}"

    # ------------------------------------------------------------ structure

    def _split(self, total: int, count: int) -> list[int]:
        """Split ``total`` into ``count`` non-negative heavy-tailed parts summing to it."""
        pareto = self.rng.paretovariate
        cumulative = list(accumulate(pareto(1.6) for _ in range(count)))
        scale = total / cumulative[-1]
        cuts = [min(total, int(c * scale)) for c in cumulative[:-1]]
        cuts.append(total)
        return [b - a for a, b in pairwise([0, *cuts])]

    def _files(self, parent: str, names: list[str], seen: set[str]) -> None:
        append = self.out.append
        for name in names:
            if name in seen:
                name = _fresh(name, seen)
            seen.add(name)
            append((f"{parent}/{name}", False))

    def _subdirs(
        self,
        parent: str,
        depth: int,
        total: int,
        names: list[str],
        seen: set[str],
        fill: Callable[[str, int, int], None],
    ) -> None:
        """Create the directories ``names`` under ``parent`` holding ``total`` entries in all."""
        for name, size in zip(names, self._split(total - len(names), len(names)), strict=True):
            if name in seen:
                name = _fresh(name, seen)
            seen.add(name)
            child = f"{parent}/{name}"
            self.out.append((child, True))
            fill(child, depth + 1, size)

    def _tree(self, path: str, depth: int, budget: int, seen: set[str] | None = None) -> None:
        """Fill directory ``path`` at ``depth`` with a free-form tree of ``budget`` entries."""
        if seen is None:
            seen = set()
        rnd = self.rng.random
        r = rnd()
        leaf_size = 5 + int(r * 40) if r > 0.03 else 100 + int(rnd() * 3000)
        if depth >= MAX_DEPTH - 1 or budget <= leaf_size:
            self._files(path, self._file_names(budget), seen)
            return
        loose = int(rnd() * min(budget // 8, 12))
        rest = budget - loose
        count = max(2, min(rest // 16, int(rest ** (0.2 + 0.3 * rnd()))))
        self._files(path, self._file_names(loose), seen)
        self._subdirs(path, depth, rest, self._dir_names(count), seen, self._tree)

    def _top(self, name: str) -> str:
        path = "/" + name
        self.out.append((path, True))
        return path

    # ---------------------------------------------------------------- trees

    def data(self, budget: int) -> None:
        path, rest = self._top("data"), budget - 1
        if rest:
            names = [self._word_name() for _ in range(_count(rest, 15_000))]
            self._subdirs(path, 1, rest, names, set(), self._tree)

    def home(self, budget: int) -> None:
        path, rest = self._top("home"), budget - 1
        if rest:
            rnd = self.rng.random
            names = [
                _pick(_USERS, rnd) + (str(int(rnd() * 100)) if rnd() < 0.5 else "")
                for _ in range(_count(rest, 1_000))
            ]
            self._subdirs(path, 1, rest, names, set(), self._home_dir)

    def _home_dir(self, path: str, depth: int, budget: int) -> None:
        dotfiles = self.rng.sample(_DOTFILES, min(budget, int(self.rng.random() * 5)))
        seen: set[str] = set()
        self._files(path, dotfiles, seen)
        self._tree(path, depth, budget - len(dotfiles), seen)

    def warehouse(self, budget: int) -> None:
        path, rest = self._top("warehouse"), budget - 1
        if rest:
            names = [self._word_name() + ".db" for _ in range(_count(rest, 25_000))]
            self._subdirs(path, 1, rest, names, set(), self._database)

    def _database(self, path: str, depth: int, budget: int) -> None:
        if budget:
            rnd = self.rng.random
            names = [
                _pick(_WORDS, rnd) + "_" + _pick(_WORDS, rnd) for _ in range(_count(budget, 1_500))
            ]
            self._subdirs(path, depth, budget, names, set(), self._table)

    def _parquet(self, path: str, count: int) -> None:
        """``count`` files one Spark job wrote into ``path``."""
        job = self._hex(8)
        names = [f"part-{i:05d}-{job}-c000.snappy.parquet" for i in range(count)]
        if count > 1 and self.rng.random() < 0.3:
            names[-1] = "_SUCCESS"
        self._files(path, names, set())

    def _table(self, path: str, depth: int, budget: int) -> None:
        rnd, append = self.rng.random, self.out.append
        if rnd() < 0.1:
            self._parquet(path, budget)
            return
        dates = _dates()
        day = int(rnd() * len(dates) / 2)
        hourly = rnd() < 0.1
        # Enough files per partition (a day holds at least half of
        # per_partition) that the table never runs out of dates.
        per_partition = max(5 + int(rnd() * 40), 2 * budget // (len(dates) - day) + 1)
        left = budget
        while left:
            partition = f"{path}/dt={dates[day]}"
            day += 1
            append((partition, True))
            left -= 1
            if hourly:
                for hour in range(24):
                    if not left:
                        break
                    append((f"{partition}/hour={hour:02d}", True))
                    files = min(left - 1, max(1, int(per_partition * (0.5 + rnd()) / 4)))
                    self._parquet(f"{partition}/hour={hour:02d}", files)
                    left -= 1 + files
            else:
                files = min(left, max(1, int(per_partition * (0.5 + rnd()))))
                self._parquet(partition, files)
                left -= files

    def var(self, budget: int) -> None:
        self._top("var")
        if budget > 1:
            path, rest = "/var/log", budget - 2
            self.out.append((path, True))
            if rest:
                rnd = self.rng.random
                names = [
                    _pick(_SERVICES, rnd) + ("" if rnd() < 0.7 else "-" + _pick(_WORDS, rnd))
                    for _ in range(_count(rest, 3_000))
                ]
                self._subdirs(path, 2, rest, names, set(), self._service_logs)

    def _service_logs(self, path: str, depth: int, budget: int) -> None:
        """Current logs, then rotated ones archived as ``YYYY/MM/DD/``."""
        rnd, append = self.rng.random, self.out.append
        service = path.rsplit("/", 1)[1]
        current = [f"{service}.log", f"{service}.out", f"{service}.err", "gc.log"]
        current = current[: min(budget, 1 + int(rnd() * 4))]
        self._files(path, current, set())
        left = budget - len(current)
        dates = _dates()
        day = int(rnd() * len(dates) / 2)
        hosts = 1 + int(rnd() * 8)
        per_day = 4 + int(rnd() * 30)
        # At least this many files a day, so the service never runs out of dates.
        min_files = left // (len(dates) - day) + 1
        year = month = year_dir = month_dir = ""
        while left:
            iso = dates[day]
            day += 1
            if iso[:4] != year:
                year, month = iso[:4], ""
                year_dir = f"{path}/{year}"
                append((year_dir, True))
                left -= 1
            if left and iso[5:7] != month:
                month = iso[5:7]
                month_dir = f"{year_dir}/{month}"
                append((month_dir, True))
                left -= 1
            if left:
                day_dir = f"{month_dir}/{iso[8:]}"
                append((day_dir, True))
                left -= 1
                files = min(left, min_files + int(rnd() * per_day))
                names = [f"{service}-node{i % hosts:02d}.{i // hosts}.log.gz" for i in range(files)]
                self._files(day_dir, names, set())
                left -= files

    def tmp(self, budget: int) -> None:
        path, rest = self._top("tmp"), budget - 1
        seen: set[str] = set()
        loose = rest // 20
        self._files(path, self._file_names(loose), seen)
        rest -= loose
        if rest:
            rnd = self.rng.random
            names = [
                _pick(_TMP_PREFIXES, rnd) + self._hex(8) for _ in range(_count(rest, 40))
            ]
            self._subdirs(path, 1, rest, names, seen, self._tree)


def generate_entries(n: int, seed: int = 0) -> list[tuple[str, bool]]:
    """``n`` unique normalized absolute paths with ``is_dir`` flags, parents first.

    The same ``(n, seed)`` always gives the same list (on any platform: only
    ``random.Random`` with an integer seed is used).
    """
    if n < 0:
        raise ValueError(f"n must be non-negative, not {n}")
    exact = [n * share for _, share in _TREES]
    budgets = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: budgets[i] - exact[i])
    for i in by_remainder[: n - sum(budgets)]:
        budgets[i] += 1
    builder = _Builder(seed)
    for (tree, _), budget in zip(_TREES, budgets, strict=True):
        if budget:
            getattr(builder, tree)(budget)
    return builder.out


def generate_paths(n: int, seed: int = 0) -> list[str]:
    """``n`` unique normalized absolute paths (directories and files), parents first."""
    return [path for path, _ in generate_entries(n, seed)]
