"""`bootseer sim --engine compiled`: a real mypyc build of the cores, the same results.

The build takes about a minute of CPU here, so one build (in a temporary cache)
serves every test of the module.
"""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from test_sim import BASE

from p2p.cli import main
from simulations import compiled, hugearena

# Two contents (one with a hot set); then the same with nodes failing midway.
SCENARIO = BASE + """
[[workload.content]]
name = "deps"
size = "64MiB"
chunk_size = "4MiB"
origin = "registry"
"""
CHURN = SCENARIO.replace('start_jitter = "500ms"',
                         'start_jitter = "500ms"\nfail_fraction = 0.2\n'
                         'fail_window_start = "100ms"\nfail_window_end = "400ms"')
VARIES = {"wall_seconds", "cpu_seconds", "peak_rss_mb", "engine"}


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("sim-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BOOTSEER_CACHE", str(path))
        compiled.build()
        yield path
    shutil.rmtree(path, ignore_errors=True)


def _run(tmp_path: Path, capfd: pytest.CaptureFixture[str], name: str, text: str,
         *extra: str) -> tuple[dict[str, object], str]:
    scenario = tmp_path / "launch.toml"
    scenario.write_text(text)
    out = tmp_path / name
    assert main(["sim", str(scenario), "--out", str(out), "--json", *extra]) == 0
    captured = capfd.readouterr()
    return json.loads(captured.out.strip().splitlines()[-1]), captured.err


@pytest.mark.parametrize("text", [SCENARIO, CHURN], ids=["launch", "churn"])
def test_the_compiled_engine_computes_what_the_python_engine_does(
        cache: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], text: str) -> None:
    fast, err = _run(tmp_path, capfd, "compiled", text)
    slow, _ = _run(tmp_path, capfd, "python", text, "--engine", "python")
    assert (fast["engine"], slow["engine"]) == ("compiled", "python")
    assert "compiling" not in err  # the module's build was reused
    assert {k: v for k, v in fast.items() if k not in VARIES} == \
           {k: v for k, v in slow.items() if k not in VARIES}
    per_node = [pq.read_table(tmp_path / run / "nodes.parquet") for run in ("compiled", "python")]
    assert per_node[0].num_rows == 24
    assert per_node[0].equals(per_node[1])


def test_the_build_holds_the_hot_modules_as_extensions(cache: Path) -> None:
    [build] = [p for p in (cache / "sim-compiled").iterdir() if (p / ".complete").exists()]
    for module in ("p2p/swarm/swarm", "p2p/swarm/node", "simulations/simulation",
                   "simulations/network", "tracker/registry"):
        assert list(build.glob(f"{module}.*.so")), module
    assert compiled.build() == build


def test_an_edited_source_gets_a_new_key(tmp_path: Path) -> None:
    root = tmp_path / "src"
    for pkg in compiled.PACKAGES:
        shutil.copytree(compiled.source_root() / pkg, root / pkg,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    before = compiled.digest(root)
    assert compiled.digest(root) == before
    (root / "p2p/swarm/policy.py").write_text((root / "p2p/swarm/policy.py").read_text() + "\n")
    assert compiled.digest(root) != before


def test_without_a_c_compiler_the_run_says_so_and_runs_as_python(
        tmp_path: Path, capfd: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BOOTSEER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", "/bin/false")
    summary, err = _run(tmp_path, capfd, "nocc", BASE.replace("nodes = 24", "nodes = 8"))
    assert summary["engine"] == "python"
    assert summary["ready_nodes"] == 8
    assert "cannot build the compiled engine (mypyc failed" in err
    assert "Traceback" not in err
    assert list((tmp_path / "cache/sim-compiled").iterdir()) == []  # nothing half-built


def test_an_unwritable_cache_is_said_and_the_run_goes_on_as_python(
        tmp_path: Path, capfd: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("BOOTSEER_CACHE", str(tmp_path / "file" / "cache"))
    summary, err = _run(tmp_path, capfd, "nocache", BASE.replace("nodes = 24", "nodes = 8"))
    assert summary["engine"] == "python"
    assert f"cannot write the build in {tmp_path / 'file'}" in err
    assert "Traceback" not in err


def test_runs_started_together_make_one_build(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep's workers or a test beside a study: one compiles, the others wait for it.
    (The compile step is replaced by a slow one that counts: what is tested is the
    waiting, and a real compile takes a minute.)"""
    made: list[Path] = []

    def slow_compile(root: Path, work: Path) -> None:
        made.append(work)
        time.sleep(0.5)
        (work / ".complete").touch()

    monkeypatch.setattr(compiled, "_compile", slow_compile)
    (tmp_path / "src" / "p2p").mkdir(parents=True)
    (tmp_path / "src" / "p2p" / "a.py").write_text("x = 1\n")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        builds = list(pool.map(lambda _: compiled.build(tmp_path / "src", tmp_path / "cache"),
                               range(3)))
    assert len(made) == 1
    assert len(set(builds)) == 1 and (builds[0] / ".complete").exists()


def test_a_run_process_gets_glibc_malloc_on_huge_pages_unless_the_caller_chose(
        tmp_path: Path) -> None:
    """The fallback: a build without the arena module (no C compiler at install time)."""
    build = tmp_path / "build"
    env = compiled.child_env(build, {"PATH": "/usr/bin", "PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(":") == [str(build), "/elsewhere"]
    assert (env["PYTHONMALLOC"], env["GLIBC_TUNABLES"]) == ("malloc", "glibc.malloc.hugetlb=1")
    assert env["PATH"] == "/usr/bin"
    mine = compiled.child_env(build, {"PYTHONMALLOC": "pymalloc",
                                      "GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
    assert (mine["PYTHONMALLOC"], mine["GLIBC_TUNABLES"]) == ("pymalloc", "glibc.malloc.hugetlb=0")
    other = compiled.child_env(build, {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert other["GLIBC_TUNABLES"] == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"


def test_with_the_arena_module_in_the_build_the_child_stays_on_pymalloc(tmp_path: Path) -> None:
    build = tmp_path / "build"
    (build / "simulations").mkdir(parents=True)
    (build / hugearena.NATIVE[0]).write_bytes(b"")
    env = compiled.child_env(build, {"PATH": "/usr/bin"})
    assert "PYTHONMALLOC" not in env
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"  # for what pymalloc passes on
    mine = compiled.child_env(build, {"PYTHONMALLOC": "malloc"})
    assert mine["PYTHONMALLOC"] == "malloc"


def test_the_child_of_the_build_installs_the_arenas_of_the_build(cache: Path) -> None:
    [build] = [p for p in (cache / "sim-compiled").iterdir() if (p / ".complete").exists()]
    assert hugearena.built_in(build)  # copied in, and part of the build's key
    probe = ("import json; from simulations import hugearena; "
             "print(json.dumps([hugearena.__file__, hugearena.install(), hugearena.stats()]))")
    done = subprocess.run([sys.executable, "-P", "-c", probe], env=compiled.child_env(build),
                          capture_output=True, text=True, check=True, cwd=build)
    where, installed, stats = json.loads(done.stdout)
    assert Path(where).is_relative_to(build)
    assert installed and stats["installed"]


def test_the_run_on_huge_page_arenas_computes_what_the_run_on_glibc_does(
        cache: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONMALLOC", raising=False)
    arenas, _ = _run(tmp_path, capfd, "arenas", CHURN)
    monkeypatch.setenv("PYTHONMALLOC", "malloc")  # the caller's choice: glibc's malloc
    glibc, _ = _run(tmp_path, capfd, "glibc", CHURN)
    assert arenas["engine"] == glibc["engine"] == "compiled"
    assert {k: v for k, v in arenas.items() if k not in VARIES} == \
           {k: v for k, v in glibc.items() if k not in VARIES}
    per_node = [pq.read_table(tmp_path / run / "nodes.parquet") for run in ("arenas", "glibc")]
    assert per_node[0].equals(per_node[1])
